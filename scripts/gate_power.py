"""Usage: python scripts/gate_power.py [--plants 0.01,0.03,0.05,0.10] [--gates 5] [--aa 10]
                                     [--aa-neighbour 10] [--gates-neighbour 0]
                                     [--neighbour SPEC]
                                     [--out DIR | --resume DIR] [--lock FILE]
       python scripts/gate_power.py --tables DIR [DIR ...]

Measures the gate's power and its false alarms on this machine, the way `make gate` judges
timings: a scratch clone of HEAD (the base), one commit per planted share on top of it whose
scheduler spins that share of each step's own time at the end of the step (real host work,
no collective added: a 5 % plant makes every step 5 % longer), a baseline recorded from a ci
run of the base (its commit the baseline revision, this tree's gate.json settings kept:
thresholds and ab), then `bench gate RUN --ab` --gates times per plant (a FAIL of a timing
check is a catch), --aa times on the base itself (every FAIL is a false alarm) and
--aa-neighbour times on the base beside the planted noisy neighbour (`--neighbour`, default
bench.neighbour's default), and --gates-neighbour times per plant beside it. Each revision's
ci run is made once and copied for each of its gates: the timing checks do not read it.

Prints one line per gate (its last line, the paired repeats, the seconds) and a table of
each kind's FAIL, INCONCLUSIVE and PASS, read from each gate's decision.json (RUN/ab), and
writes gate_power.json and gate_power.md into --out (default
results/gate_power_<UTC time>). Needs a committed HEAD; a gate takes 2 to 8 minutes on 2
cores. Measure the quiet rows on a quiet machine.

The gates run interleaved, one of each kind a round (an A/A, each plant, an A/A beside the
neighbour), so a study cut short keeps its kinds balanced and the machine's quieter and
busier hours spread over all of them. `--resume DIR` goes on with an earlier study (its
clone, base, plants and baseline kept) until each kind has the counts asked for: a study
can grow over several sittings at one base. `--lock FILE` (default /tmp/hicache-cpu.lock)
is taken exclusively around each gate; other work on the machine that takes it shared
(`flock -s FILE CMD`) waits for the gate in flight and holds the next one back, so no gate
shares the cores with it. Each gate records the seconds it waited and the load before it.
`--resume DIR --aa 0 --gates 0 --aa-neighbour 0` runs nothing and writes the tables again.
`--tables DIR [DIR ...]` runs nothing and prints the tables over several studies' gates
together (their thresholds must agree), writing nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.neighbour import DEFAULT, Neighbour, SpecError  # noqa: E402
from bench.neighbour import parse as parse_neighbour  # noqa: E402
from bench.rundir.files import write_json_atomic, write_text_atomic  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from gate_power_tables import (  # noqa: E402,F401 (tables: the tests read them here)
    budget_rows,
    cpu_lost,
    gate_rows,
    lines,
    read_decision,
    table,
    verdict,
)

SCHEDULER = Path("hicache") / "serve" / "scheduler.py"
STEP_TOP = "        self.stats.counter.step = step\n        stamp = msg[\"now\"]"
STEP_END = "        rec.t_end = self._clock()\n"
GIT = ["git", "-c", "user.name=gate-power", "-c", "user.email=gate-power@localhost"]


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"gate_power: {' '.join(cmd[:4])} failed: {done.stderr.strip()[-500:]}")
    return done


def plant_commit(repo: Path, share: float) -> str:
    """A branch off the base whose scheduler spins `share` of each step's time so far at
    the end of every step."""
    sh(GIT + ["checkout", "-q", "-B", f"plant_{share:g}", "base"], repo)
    path = repo / SCHEDULER
    path.write_text(planted(path.read_text(), share))
    sh(GIT + ["commit", "-qam", f"scheduler: every step spins {share:.0%} more"], repo)
    return sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()


def planted(text: str, share: float) -> str:
    """The scheduler's source with the plant: at the end of every step, a spin of `share`
    times the step's own time until then."""
    if STEP_TOP not in text or STEP_END not in text:
        sys.exit("gate_power: the scheduler's step moved: update STEP_TOP / STEP_END")
    text = text.replace(STEP_TOP, "        _planted_t0 = time.perf_counter()\n" + STEP_TOP, 1)
    return text.replace(STEP_END, (
        "        _planted_end = time.perf_counter() + "
        f"{share!r} * (time.perf_counter() - _planted_t0)\n"
        "        while time.perf_counter() < _planted_end:  # the planted regression\n"
        "            pass\n") + STEP_END, 1)


def bench(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "bench", *args], repo, check=False)


def record_baseline(repo: Path, out: Path) -> Path:
    """A ci run of the base, made the baseline; this tree's gate settings kept."""
    run, baseline = out / "runs" / "base", out / "baseline"
    if bench(repo, "run", "--preset", "ci", "--out", str(run)).returncode != 0:
        sys.exit("gate_power: the base's ci run failed")
    ours = json.loads((REPO / "results" / "baseline" / "gate.json").read_text())
    baseline.mkdir(parents=True)
    (baseline / "gate.json").write_text(json.dumps(
        {k: ours[k] for k in ("thresholds", "ab") if k in ours}))
    done = bench(repo, "gate", str(run), "--baseline", str(baseline), "--update-baseline")
    if done.returncode != 0:
        sys.exit(f"gate_power: recording the baseline failed: {done.stdout[-500:]}")
    return baseline


def ci_run(repo: Path, rev: str, out: Path) -> Path:
    """The ci run of `rev`, made once."""
    run = out / "runs" / rev[:10]
    if not run.exists():
        sh(["git", "checkout", "-q", rev], repo)
        bench(repo, "run", "--preset", "ci", "--out", str(run))
    return run


def gate_once(repo: Path, rev: str, run: Path, baseline: Path, out: Path, label: str,
              neighbour) -> dict:
    """`bench gate --ab` at `rev` on a fresh copy of its ci run."""
    sh(["git", "checkout", "-q", rev], repo)
    kind = label.replace("A/A ", "aa_").replace("plant ", "plant_").replace("%", "pc") \
        .replace(" ", "_")
    copy = out / "gates" / f"{len(list((out / 'gates').glob('*'))):02d}_{kind}"
    shutil.copytree(run, copy)
    t0 = time.monotonic()
    load_before = os.getloadavg()[0]
    with Neighbour(neighbour) if neighbour else contextlib.nullcontext():
        done = bench(repo, "gate", str(copy), "--baseline", str(baseline), "--ab")
    last = (done.stdout.strip().splitlines() or [""])[-1]
    ab = copy / "ab" / "ab.json"
    stages = json.loads(ab.read_text())["stages"] if ab.exists() else []
    d = read_decision(copy) or {"verdict": None, "states": {}, "intervals": {}}
    return {"label": label, "rev": rev, "exit": done.returncode, "verdict": d["verdict"],
            "states": d["states"], "repeats": sum(s["repeats"] for s in stages),
            "stages": len(stages), "intervals": d["intervals"], "last_line": last,
            "seconds": round(time.monotonic() - t0, 1), "load_1m_before": load_before,
            "load_1m": os.getloadavg()[0], "dir": str(copy),
            "utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[4])
    p.add_argument("--plants", default="0.01,0.03,0.05,0.10")
    p.add_argument("--gates", type=int, default=5)
    p.add_argument("--aa", type=int, default=10)
    p.add_argument("--aa-neighbour", type=int, default=10)
    p.add_argument("--gates-neighbour", type=int, default=0)
    p.add_argument("--neighbour", default=DEFAULT)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path)
    where.add_argument("--resume", type=Path)
    where.add_argument("--tables", type=Path, nargs="+")
    p.add_argument("--lock", type=Path, default=Path("/tmp/hicache-cpu.lock"))
    args = p.parse_args(argv)
    try:
        args.plants = [float(x) for x in args.plants.split(",") if x.strip()
                       and x.strip() != "none"]
        args.neighbour = parse_neighbour(args.neighbour)
    except (ValueError, SpecError) as e:
        sys.exit(f"gate_power: {e}")
    if any(s <= 0 for s in args.plants) or min(args.gates, args.aa, args.aa_neighbour,
                                               args.gates_neighbour) < 0:
        sys.exit("gate_power: --plants must be > 0, --gates and --aa counts >= 0")
    if args.out is not None and args.out.exists() and (
            not args.out.is_dir() or any(args.out.iterdir())):
        sys.exit(f"gate_power: --out {args.out} is not an empty folder: pick a new one")
    if args.resume is not None and not (args.resume / "gate_power.json").is_file():
        sys.exit(f"gate_power: --resume {args.resume} holds no gate_power.json: "
                 "not a study to go on with")
    for d in args.tables or []:
        if not ((d / "gate_power.json").is_file() and (d / "baseline" / "gate.json").is_file()):
            sys.exit(f"gate_power: --tables {d} holds no gate_power.json and baseline: "
                     "not a study")
    return args


def plant_label(share: float) -> str:
    return f"plant {share:.0%}"


def interleaved(kinds: list[tuple[str, int]], done: dict[str, int]) -> list[str]:
    """The labels still to run, one of each kind a round, in the order `kinds` lists them,
    until each kind has its count (`done` already run)."""
    left = {k: max(0, n - done.get(k, 0)) for k, n in kinds}
    rounds = []
    for r in range(max(left.values(), default=0)):
        rounds.extend(k for k, _ in kinds if left[k] > r)
    return rounds


@contextlib.contextmanager
def holding(lock: Path):
    """The machine's CPU lock, exclusively, for one gate."""
    lock.touch(exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def setup(args: argparse.Namespace) -> tuple[Path, Path, str, list[dict], dict[float, str]]:
    """The study's folder, clone, baseline, base revision, results so far and plants: a new
    one (--out), or the one --resume names, plants it lacks added."""
    if args.resume is not None:
        out = args.resume.resolve()
        old = json.loads((out / "gate_power.json").read_text())
        head, results = old["head"], old["results"]
        repo, baseline = out / "repo", out / "baseline"
    else:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out = (args.out or REPO / "results" / f"gate_power_{stamp}").resolve()
        repo, results = out / "repo", []
        (out / "gates").mkdir(parents=True, exist_ok=True)
        head = sh(["git", "rev-parse", "HEAD"], REPO).stdout.strip()
        sh(["git", "clone", "-q", "--no-checkout", str(REPO), str(repo)], out)
        sh(GIT + ["checkout", "-q", "-B", "base", head], repo)
    have = set(sh(["git", "branch", "--format=%(refname:short)"], repo).stdout.split())
    planted = {s: (sh(["git", "rev-parse", f"plant_{s:g}"], repo).stdout.strip()
                   if f"plant_{s:g}" in have else plant_commit(repo, s)) for s in args.plants}
    sh(["git", "checkout", "-q", "base"], repo)
    if args.resume is None:
        baseline = record_baseline(repo, out)
    return out, baseline, head, results, planted


def tables(dirs: list[Path]) -> int:
    """--tables: several studies' gates in one set of tables; exit 2 where their thresholds
    differ (their gates did not judge alike)."""
    results, seen = [], {}
    for d in dirs:
        results += json.loads((d / "gate_power.json").read_text())["results"]
        seen[d] = json.loads((d / "baseline" / "gate.json").read_text())["thresholds"]
    if len({json.dumps(t, sort_keys=True) for t in seen.values()}) > 1:
        print("gate_power: --tables: the studies' thresholds differ: "
              + "; ".join(f"{d}: {t}" for d, t in seen.items()), file=sys.stderr)
        return 2
    print("\n".join(lines(results, next(iter(seen.values())))))
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.tables:
        return tables(args.tables)
    out, baseline, head, results, planted = setup(args)
    repo = out / "repo"
    base = sh(["git", "rev-parse", "base"], repo).stdout.strip()
    what = {"A/A quiet": (base, None), "A/A neighbour": (base, args.neighbour)}
    what |= {plant_label(s): (sha, None) for s, sha in planted.items()}
    what |= {plant_label(s) + " neighbour": (sha, args.neighbour) for s, sha in planted.items()}
    kinds = ([("A/A quiet", args.aa)] + [(plant_label(s), args.gates) for s in args.plants]
             + [("A/A neighbour", args.aa_neighbour)]
             + [(plant_label(s) + " neighbour", args.gates_neighbour) for s in args.plants])
    done = {k: len(list(g)) for k, g in itertools.groupby(
        sorted(r["label"] for r in results))}
    todo = interleaved(kinds, done)
    print(f"gate_power: {out}: {len(results)} gates so far, {len(todo)} to run", flush=True)
    for label in todo:
        rev, neighbour = what[label]
        run = ci_run(repo, rev, out)
        t_wait = time.monotonic()
        with holding(args.lock):
            waited = time.monotonic() - t_wait
            r = gate_once(repo, rev, run, baseline, out, label, neighbour)
        r["lock_wait_s"] = round(waited, 1)
        results.append(r)
        write_json_atomic(out / "gate_power.json", {"head": head, "results": results,
                                                    "cpu_count": os.cpu_count()})
        print(f"gate_power: {label}: exit {r['exit']}, {r['repeats']} paired repeats in "
              f"{r['seconds']:.0f}s (load {r['load_1m_before']:.2f} before, waited "
              f"{waited:.0f}s): {r['last_line']}", flush=True)
    text = "\n".join(lines(results, json.loads((baseline / "gate.json").read_text())[
        "thresholds"]))
    write_text_atomic(out / "gate_power.md", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
