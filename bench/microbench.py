"""`python -m bench microbench RUN_DIR [--no-run]`: pytest-benchmark micro-benchmarks saved
with a run and compared side by side inside it.

Runs `pytest -m microbench tests/microbench --benchmark-enable` (one check_prefetch_progress
poll per protocol x policy on a real 2-rank gloo group, radix-tree match/insert, the page
hash chain), saves RUN_DIR/microbench.json, and writes RUN_DIR/microbench.md from that JSON
alone: per policy, each protocol's median per-poll cost and its ratio to pr27010's (the
headline is pr36425 over pr27010). --no-run rebuilds microbench.md from an existing JSON.
Exit codes: 0 OK, 1 a benchmark failed (its checks or its run), 2 bad input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.report.printer import say_err
from bench.rundir.env import REPO_DIR
from bench.rundir.files import ResultFileError, read_json_object
from bench.rundir.rundir import FILES

JSON_NAME, MD_NAME = FILES["microbench"], "microbench.md"
REFERENCE, HEADLINE = "pr27010", "pr36425"
TIMEOUT_S = 600.0
US = 1e6


def load(path: Path) -> dict:
    """A pytest-benchmark JSON file, checked for the fields the tables use."""
    data = read_json_object(path)
    benches = data.get("benchmarks")
    if not isinstance(benches, list) or not all(
            isinstance(b, dict) and "median" in b.get("stats", {}) for b in benches):
        raise ResultFileError(f"{path}: not a pytest-benchmark JSON (no benchmarks with stats)")
    return data


def poll_rows(data: dict) -> dict[str, dict[str, dict]]:
    """policy -> protocol -> the poll benchmark's row, in the order the JSON lists them."""
    out: dict[str, dict[str, dict]] = {}
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if info.get("kind") == "poll":
            out.setdefault(info["policy"], {})[info["protocol"]] = b
    return out


def poll_ratios(data: dict) -> dict[str, dict[str, float | None]]:
    """policy -> protocol -> median per-poll cost over pr27010's (None: no pr27010 row)."""
    ratios = {}
    for policy, rows in poll_rows(data).items():
        ref = rows.get(REFERENCE)
        base = ref["stats"]["median"] if ref else None
        ratios[policy] = {p: (b["stats"]["median"] / base if base else None)
                          for p, b in rows.items()}
    return ratios


def _x(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.3f}"


def headline(data: dict) -> str:
    """'best_effort 0.05x, ...': pr36425's per-poll cost over pr27010's, per policy."""
    parts = [f"{policy} {_x(r.get(HEADLINE))}x" for policy, r in poll_ratios(data).items()
             if r.get(HEADLINE) is not None]
    return ", ".join(parts) or "no pr36425/pr27010 pair"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _poll_section(data: dict) -> list[str]:
    ratios = poll_ratios(data)
    lines = []
    header = ["protocol", "median_us", "q1_us", "q3_us", "rounds", "decision_coll_per_poll",
              "completion_coll_per_poll", "ranks_agree", f"ratio_vs_{REFERENCE}"]
    for policy, rows in poll_rows(data).items():
        body = []
        for protocol, b in rows.items():
            s, info = b["stats"], b["extra_info"]
            body.append([protocol, f"{s['median'] * US:.1f}", f"{s['q1'] * US:.1f}",
                         f"{s['q3'] * US:.1f}", str(s["rounds"]),
                         f"{info.get('decision_collectives_per_poll', '')}",
                         f"{info.get('completion_collectives_per_poll', '')}",
                         str(info.get("ranks_agree", "")), _x(ratios[policy][protocol])])
        lines += ["", f"### policy {policy}", "", *_table(header, body)]
    return lines


def _other_section(data: dict) -> list[str]:
    body = []
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if info.get("kind") in (None, "poll"):
            continue
        s = b["stats"]
        what = ", ".join(f"{k}={v}" for k, v in info.items() if k != "kind")
        body.append([info["kind"], f"{s['median'] * US:.2f}", f"{s['q1'] * US:.2f}",
                     f"{s['q3'] * US:.2f}", str(s["rounds"]), what])
    if not body:
        return []
    return ["", "## Host-side structures", "",
            *_table(["benchmark", "median_us", "q1_us", "q3_us", "rounds", "what"], body)]


def build_markdown(data: dict, source: str = JSON_NAME) -> str:
    """microbench.md from a pytest-benchmark JSON alone."""
    commit = data.get("commit_info") or {}
    machine = data.get("machine_info") or {}
    agree = all(b["extra_info"].get("ranks_agree") is True
                for rows in poll_rows(data).values() for b in rows.values())
    n = len(data["benchmarks"])
    lines = [
        "# Micro-benchmarks", "",
        f"Source: `{source}` (pytest-benchmark {data.get('version', '?')}, "
        f"{data.get('datetime', '?')}), commit {str(commit.get('id', '?'))[:12]}"
        f"{' (dirty)' if commit.get('dirty') else ''}, host {machine.get('node', '?')}, "
        f"Python {machine.get('python_version', '?')}.", "",
        "Per-poll cost: rank 0's time for one `HiCache.check_prefetch_progress` of a pending "
        "prefetch on a real 2-rank gloo group (TP2, PP1), one poll per round, both ranks "
        "released together by a flag all-reduce before each round; median and quartiles over "
        "the rounds (pytest-benchmark's percentiles). Ratios are medians over pr27010's "
        "median, same policy, same run: information only, never gated (timings on a shared "
        "machine are noise; the collective counts are the exact check).", "",
        f"**Headline, per-poll cost {HEADLINE} / {REFERENCE}:** {headline(data)}", "",
        "## check_prefetch_progress, per policy",
        *_poll_section(data),
        *_other_section(data), "",
        f"{'OK' if agree else 'FAILED'}: {n} benchmarks"
        f"{'' if agree else '; a poll row did not agree across ranks'}", ""]
    return "\n".join(lines)


def gate_note(run_dir: Path) -> str:
    """The line `bench gate` prints (information, not a check) when the run has the JSON."""
    path = run_dir / JSON_NAME
    if not path.exists():
        return ""
    try:
        return f"microbench (information, not gated): per-poll {HEADLINE}/{REFERENCE} " \
               f"{headline(load(path))}"
    except ResultFileError as e:
        return f"microbench (information, not gated): {e}"


def run_pytest(run_dir: Path) -> int:
    """The micro-benchmark subset; the JSON lands in run_dir atomically (temp name, rename)."""
    tmp = run_dir / f".{JSON_NAME}.tmp"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "microbench",
           "tests/microbench", "--benchmark-enable", f"--benchmark-json={tmp}",
           "--benchmark-columns=median,iqr,rounds", "--benchmark-sort=name"]
    try:
        code = subprocess.run(cmd, cwd=REPO_DIR, timeout=TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        say_err(f"bench microbench: pytest ran past {TIMEOUT_S:.0f}s")
        code = 1
    if tmp.exists():
        os.replace(tmp, run_dir / JSON_NAME)
    return code
