"""The planted noisy neighbour (bench.neighbour): its spec, its seeded pattern, that it
takes CPU while it runs and stops when told, and that a run records it in env.json."""

import resource
import subprocess
import sys

import pytest

from bench import neighbour
from bench.commands.run import main as main_run
from bench.commands.run import planted
from bench.run.plan import RunPlan

BAD = [("cpu=0", "cpu must be in (0, 1]"), ("cpu=1.5", "cpu must be in (0, 1]"),
       ("burst=2s-50ms", "0 < MIN <= MAX"), ("burst=50ms", "expected MIN-MAX"),
       ("burst=fast-2s", "is not a duration"), ("loud=1", "unknown key 'loud'"),
       ("cpu", "is not KEY=VALUE"), ("seed=x", "seed='x'")]


def test_default_and_off():
    assert neighbour.parse("default") == neighbour.NeighbourSpec(0.5, 0.05, 2.0, 0)
    assert neighbour.parse("off") is None and neighbour.parse(None) is None
    spec = neighbour.parse("cpu=0.25,burst=10ms-0.5,seed=7")
    assert (spec.cpu, spec.burst_min_s, spec.burst_max_s, spec.seed) == (0.25, 0.01, 0.5, 7)
    assert neighbour.parse(spec.text) == spec  # the recorded text reads back


@pytest.mark.parametrize("text,message", BAD)
def test_bad_spec_is_one_line(text, message):
    with pytest.raises(neighbour.SpecError, match=message.replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]").replace("[", r"\[")):
        neighbour.parse(text)


def test_bad_spec_on_the_command_line_is_exit_2(capsys, tmp_path):
    assert main_run(["--neighbour", "cpu=3", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu must be in (0, 1]" in err[0]


def test_pattern_is_seeded_and_takes_its_share():
    a, b = neighbour.NeighbourSpec(seed=1), neighbour.NeighbourSpec(seed=2)
    assert a.pattern(50) == neighbour.NeighbourSpec(seed=1).pattern(50)
    assert a.pattern(50) != b.pattern(50)
    bursts = [x for x, _ in a.pattern(4000)]
    assert 0.05 <= min(bursts) and max(bursts) <= 2.0
    busy = sum(bursts) / sum(x + g for x, g in a.pattern(4000))
    assert busy == pytest.approx(0.5, abs=0.05)
    assert neighbour.NeighbourSpec(cpu=1.0).pattern(5)[0][1] == 0.0  # never idle


def test_the_process_takes_cpu_and_exits():
    """`python -m bench.neighbour` spins in its bursts (CPU time, not sleep) and ends."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "bench.neighbour",
                           "cpu=1,burst=50ms-100ms", "--seconds", "1.0"], timeout=30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0
    # Even sharing 2 cores with others it gets some of one; a sleeper would get ~0.
    assert after.ru_utime - before.ru_utime > 0.15


def test_planted_around_a_block_records_what_ran():
    plan = RunPlan(neighbour=neighbour.parse("cpu=1,burst=20ms-40ms,seed=3").text)
    with planted(plan) as record:
        import time
        time.sleep(1.0)
    assert record["spec"] == "cpu=1,burst=20ms-40ms,seed=3"
    assert record["wall_s"] >= 1.0 and record["cpu_s"] is not None and record["cpu_s"] > 0
    with planted(RunPlan()) as none:
        pass
    assert none == {}


def test_bad_spec_for_an_ab_is_exit_2_before_any_run(capsys):
    from bench.commands.ab import main as main_ab

    assert main_ab(["HEAD", "HEAD", "--neighbour", "burst=1s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected MIN-MAX" in err[0]
