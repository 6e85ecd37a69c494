"""The tutorial's and the how-to guides' commands run as written (tests/test_docs.py parses
the `python -m bench` ones; this file runs them). Every command those pages show, in a code
block or inline, is in one of two named sets: RUN, run here for real in a temporary folder
(exit 0 and the verb's OK line), or NOT_RUN, with the reason it is too long or needs what a
test machine lacks (minutes of serving, a GPU, the network, a branch of SGLang). A page that
gains a command in neither set fails the test until someone classifies it, and a set entry no
page shows any more fails it too. No timing is asserted."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_compare import RUN as SMALL_RUN
from tests.test_docs import HOW_TO, REPO

# What a page's command starts with (a line of a code block or an inline `span`); a synopsis
# ([optional] parts, "...") is not a command and is parsed by tests/test_docs.py instead.
STARTS = ("python ", "python3 ", ".venv/bin/python ", "make ", "PYTHONPATH=", "git ",
          "torchrun ", "scripts/", "bash ")
MINUTES = "serves for minutes"

# Run here: the command as the page shows it (a placeholder in capitals filled in by the
# test) and the line that says it ended OK.
RUN = {
    "python -m bench report results/latest": re.compile(r"^wrote .*; the run: OK", re.M),
    "python -m bench devcheck summary WORK_DIR": re.compile(r"^RESULT: OK$", re.M),
}

NOT_RUN = {
    # the main job and its variants: minutes of serving each
    "make bench": f"{MINUTES} (5½ on 2 cores); creates .venv first",
    "python -m bench run": f"{MINUTES}: make bench's job",
    ".venv/bin/python -m bench run --repeats 3": f"{MINUTES} (one or two)",
    "python -m bench run --preset cost": f"{MINUTES}: every protocol x policy, 6 repeats",
    "python -m bench run --preset trace": f"{MINUTES} (about 5 on 2 cores)",
    "python -m bench run --preset trace-sweep": f"{MINUTES} (about 11 on 2 cores)",
    "python -m bench run --trace FILE.jsonl --trace-skip 1000 --trace-requests 1000 "
    "--time-scale 1,2,4,8 --protocols pr27010,pr36425,step-clock --policies timeout":
        "FILE.jsonl is the user's own trace; a thousand requests at four loads",
    ".venv/bin/python scripts/footprint.py --out results/footprint_trace.json -- "
    ".venv/bin/python -m bench run --preset trace": f"{MINUTES}: the trace preset, measured",
    "python -m bench run --neighbour default --protocols pr27010,pr36425":
        f"{MINUTES}: the default preset beside a CPU burner",
    "python -m bench.neighbour default --seconds 60":
        "burns CPU for a minute by design (tests/test_neighbour.py runs it briefly)",
    "python -m bench ab REV_A REV_B --neighbour cpu=0.5,burst=50ms-2s,seed=1":
        "REV_A and REV_B are the user's revisions; an A/B serves for many minutes",
    # SGLang: its wheels from the network, a branch of the user's, runs of a minute or more
    "make sglang-fetch": "installs packages and downloads SGLang's wheel (the network)",
    "make dev": "installs the dev tools (the network where they are missing)",
    "make dev sglang-fetch SGLANG=": "installs packages (the network)",
    "git clone -b my-branch https://github.com/sgl-project/sglang $HOME/sglang-pr":
        "the network, and my-branch is the user's",
    "git -C $HOME/sglang-pr worktree add $HOME/sglang-base $(git -C $HOME/sglang-pr "
    "merge-base origin/main HEAD)": "$HOME/sglang-pr is the user's clone of SGLang",
    ".venv/bin/python -m bench run --cache sglang --sglang a=0.5.23,b=0.5.23 --preset ci "
    "--schedule pinned --repeats 6": "two SGLang worlds serve every policy 6 times, minutes "
                                     "(tests/test_sglang_sides.py runs its shape)",
    ".venv/bin/python -m bench run --cache sglang --sglang base=$HOME/sglang-base/python,"
    "pr=$HOME/sglang-pr/python --preset ci --schedule pinned --repeats 6":
        "$HOME/sglang-pr is the user's branch of SGLang",
    ".venv/bin/python -m bench run --cache sglang --sglang base=$HOME/sglang-base/python,"
    "pr=$HOME/sglang-pr/python": "$HOME/sglang-pr is the user's branch of SGLang",
    ".venv/bin/python -m bench review --sglang base=$BASE/python,head=$HEAD/python "
    "--strict-counts --explained \"$EXPLAINED\" --out results/review":
        "$BASE and $HEAD are a pull request's checkouts",
    ".venv/bin/python -m bench review --sglang base=$GITHUB_WORKSPACE/base/python,"
    "head=$GITHUB_WORKSPACE/head/python --strict-counts --explained \"$(cat "
    "$GITHUB_WORKSPACE/head/.hicache-explained 2>/dev/null)\" --out \"$1\"":
        "a GitHub Actions job's checkouts",
    # a GPU node
    "make bench ARGS=\"--model llama3-8b\"": "a GPU node (TP = its GPUs)",
    "make bench ARGS=\"--device cuda --data-backend gloo --model llama3-8b\"": "a GPU",
    "python3 -m bench run --device cuda --tp 1 --model llama3-8b --preset ci": "a GPU",
    "make setup && make bench": f"a GPU node's first run; {MINUTES}",
    "make gpu-check": "a GPU node",
    "python -m bench devcheck measure": "gpu_check.sh's device step, named: on a GPU, with "
                                        "the --out the script passes",
    "scripts/gpu_check.sh --dry-run": "every step of the GPU check on CPU, minutes "
                                      "(tests/test_gpu_check.py runs it, marked slow)",
}


def page_commands(page: Path) -> list[str]:
    """Every command `page` shows: a code block's lines (continuations joined, comments
    dropped) and inline spans, whitespace collapsed, each once, synopses left out."""
    text = page.read_text().replace("\\\n", " ")
    code, prose, inside = [], [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    found = [" ".join(line.split(" #")[0].split()) for line in code]
    found += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", "\n".join(prose))
              if " " in span.strip()]  # one word alone is a file or a name, not a command
    return [c for c in dict.fromkeys(found)
            if c.startswith(STARTS) and "[" not in c and "..." not in c]


def _shown() -> dict[str, str]:
    """Every command of the tutorial and the how-to pages -> the first page showing it."""
    out: dict[str, str] = {}
    for name in HOW_TO:
        for command in page_commands(REPO / "docs" / name):
            out.setdefault(command, name)
    return out


def unclassified(commands) -> list[str]:
    return [c for c in commands if c not in RUN and c not in NOT_RUN]


def test_every_command_the_pages_show_is_run_or_says_why_not():
    shown = _shown()
    assert len(shown) >= 20, "too few commands found: the scan would pass vacuously"
    assert not set(RUN) & set(NOT_RUN)
    new = [f"{shown[c]}: {c}" for c in unclassified(shown)]
    assert not new, ("commands in neither RUN nor NOT_RUN (run them here if they take "
                     "seconds, else say why not):\n" + "\n".join(new))
    gone = sorted((set(RUN) | set(NOT_RUN)) - set(shown))
    assert not gone, "classified commands no page shows any more:\n" + "\n".join(gone)


@pytest.mark.parametrize("planted", ["python -m bench run --preset new-one",
                                     "make something-new"])
def test_a_command_a_page_gains_is_caught(planted):
    assert unclassified([*RUN, *NOT_RUN, planted]) == [planted]


def test_the_scan_reads_blocks_spans_and_leaves_synopses(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("Run `make bench ARGS=\"--x\"` or `results/latest`.\n\n```bash\n"
                    "python -m bench run \\\n    --preset ci   # a comment\n"
                    "python -m bench timeline RUN_DIR [--out PATH]\n```\n")
    assert page_commands(page) == ["python -m bench run --preset ci",
                                   'make bench ARGS="--x"']


# ---- the short ones, for real -----------------------------------------------------------------

def _work_dir(root: Path) -> Path:
    """What scripts/gpu_check.sh leaves in its work folder when every step passed on a GPU
    (tests/test_gpu_check.py's figures)."""
    from tests.test_gpu_check import DEVCHECK

    (root / "status").mkdir(parents=True)
    for step in ("setup", "tests", "devcheck", "tp1", "tp2"):
        (root / "status" / step).write_text("0\n")
    (root / "tests.log").write_text("12 passed in 20.0s\n")
    (root / "devcheck.json").write_text(json.dumps(DEVCHECK))
    return root


def _as_run_here(command: str) -> list[str]:
    """The command's words, its python the one running the tests."""
    words = shlex.split(command)
    if words[0] in ("python", "python3", ".venv/bin/python"):
        words[0] = sys.executable
    return words


@pytest.mark.slow  # a small real run to report on (about 10 s), then the commands
@pytest.mark.timeout(300)
def test_the_short_commands_run_as_written(bench_run, tmp_path):
    """Each RUN command in a folder laid out as the page assumes: results/latest a run of
    this checkout (a copy: report writes into it), WORK_DIR gpu_check.sh's work folder."""
    shutil.copytree(bench_run("compare_a", *SMALL_RUN), tmp_path / "results" / "run")
    (tmp_path / "results" / "latest").symlink_to("run")
    filled = {"WORK_DIR": str(_work_dir(tmp_path / "gpu_check"))}
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_NO_PLOTS": "1"}
    for command, ok in RUN.items():
        for name, value in filled.items():
            command = command.replace(name, value)
        done = subprocess.run(_as_run_here(command), cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0 and ok.search(done.stdout), \
            f"{command}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
