"""Usage: python scripts/suite_runs.py [--runs N] [--target TARGET] [--neighbour SPEC]
                                    [--here] [--jsonl FILE]

Is the suite trustworthy? Runs `make TARGET` (default `test`, the README's command) N times
in a row, each time from a fresh clone of this checkout's HEAD (as it was at the start) in a
temporary folder, with its own venv built by the target itself, as CI does (`--here`: in
this checkout, for a tier such as `test-stats` run many times). With `--neighbour SPEC`
(bench/neighbour.py: `default` is cpu=0.5, bursts of 50 ms-2 s) a planted noisy neighbour
takes CPU beside each run. Prints one line per run as it ends (PASS/FAIL, wall time,
pytest's closing lines, the 1-minute load average at the end, every FAILED test id and every
skip reason) and a markdown table at the end; `--jsonl FILE` appends one record per run.
Exit 0 when every run passed, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_all import closing_lines  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")
SKIPPED = re.compile(r"^skipped \d+: .*")


def head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()


def one_run(i: int, target: str, neighbour: str | None, here: bool, commit: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="suite-run-") as tmp:
        clone = REPO if here else Path(tmp) / "clone"
        if not here:
            subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
            # every run tests the commit the first one did, whatever lands meanwhile
            subprocess.run(["git", "checkout", "--quiet", commit], cwd=clone, check=True)
        burner = None
        if neighbour:
            # this script's interpreter runs it from this checkout: a fresh clone's venv
            # does not exist yet
            burner = subprocess.Popen([sys.executable, "-m", "bench.neighbour", neighbour],
                                      cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        start = time.monotonic()
        try:
            done = subprocess.run(["make", target], cwd=clone, capture_output=True, text=True)
        finally:
            if burner is not None:
                burner.terminate()
                burner.wait(timeout=10)
        wall = time.monotonic() - start
    out = done.stdout + done.stderr
    return {"run": i, "target": target, "neighbour": neighbour or "off",
            "result": "PASS" if done.returncode == 0 else "FAIL",
            "seconds": round(wall), "load1_at_end": round(os.getloadavg()[0], 2),
            "pytest": closing_lines(out) or "(no pytest line)",
            "failed": [m.group(2) for line in out.splitlines() if (m := FAILED.match(line))],
            "skipped": sorted({line for line in out.splitlines() if SKIPPED.match(line)}),
            "tail": "" if done.returncode == 0 else out[-3000:]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="suite_runs.py", description=__doc__.split("\n\n")[1])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--target", default="test")
    ap.add_argument("--neighbour", default=None, help="a bench.neighbour SPEC; off by default")
    ap.add_argument("--here", action="store_true", help="run in this checkout, not a clone")
    ap.add_argument("--jsonl", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.runs < 1:
        print("suite_runs: --runs must be at least 1", file=sys.stderr)
        return 2
    if args.neighbour:
        sys.path.insert(0, str(REPO))
        from bench.neighbour import SpecError, parse
        try:
            parse(args.neighbour)
        except SpecError as exc:
            print(f"suite_runs: {exc}", file=sys.stderr)
            return 2
    commit = head()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for i in range(1, args.runs + 1):
        r = one_run(i, args.target, args.neighbour, args.here, commit)
        r |= {"commit": commit, "started": stamp}
        rows.append(r)
        print(f"run {i}: {r['result']} {r['seconds']} s load {r['load1_at_end']} "
              f"{r['pytest']}", flush=True)
        for line in r["failed"] + r["skipped"]:
            print(f"  {line}", flush=True)
        if r["tail"]:
            print(r["tail"], flush=True)
        if args.jsonl:
            with args.jsonl.open("a") as f:
                f.write(json.dumps(r) + "\n")
    where = "in the checkout" if args.here else "from a fresh clone"
    print(f"\n`make {args.target}` {where} of {commit}, {args.runs} runs in a row, "
          f"neighbour {args.neighbour or 'off'} (started {stamp}):\n")
    print("| run | result | wall s | load (1 min) at end | pytest | failed | skipped |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['result']} | {r['seconds']} | {r['load1_at_end']} | "
              f"{r['pytest']} | {', '.join(r['failed']) or '-'} | "
              f"{'; '.join(r['skipped']) or '-'} |")
    ok = all(r["result"] == "PASS" for r in rows)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
