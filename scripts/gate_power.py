"""Usage: python scripts/gate_power.py [--clean 5] [--slow-ms 0.1,0.25,0.5,1|none] [--out DIR]

Measures the gate's false positives and its power on this machine, the way `make gate` runs
it: a scratch clone of HEAD (the base), one commit per --slow-ms on top of it whose pr36425
poll sleeps that long (no collective added), a baseline recorded from a ci run of the base
(its commit the baseline revision, the gate settings of this tree's results/baseline/gate.json
kept: thresholds, ab and unresolved_ok), then `bench run --preset ci` and `bench gate RUN
--ab` on the base --clean times (every failure is a false positive) and once on each slow
commit (a failure is a catch).
Each gate run also records what its first A/B alone decided (how many checks it failed
before the confirming A/B judged them), so one measurement gives both rates.
Prints one line per gate run and a table, and writes gate_power.json into --out (default
results/gate_power_<UTC time>). Needs a committed HEAD; takes about 3 minutes per gate run on
2 cores. Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.rundir.files import write_json_atomic  # noqa: E402

ANCHOR = '    name = "pr36425"\n\n    def vote(self, f: Facts) -> Vote:\n'
GIT = ["git", "-c", "user.name=gate-power", "-c", "user.email=gate-power@localhost"]


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"gate_power: {' '.join(cmd[:4])} failed: {done.stderr.strip()[-500:]}")
    return done


def slow_commit(repo: Path, ms: float) -> str:
    """A branch off the base whose pr36425 poll sleeps `ms` milliseconds."""
    sh(GIT + ["checkout", "-q", "-B", f"slow_{ms:g}ms", "base"], repo)
    path = repo / "hicache" / "agreement" / "protocols.py"
    text = path.read_text()
    if ANCHOR not in text:
        sys.exit("gate_power: pr36425's vote moved: update ANCHOR")
    text = text.replace("from __future__ import annotations\n",
                        "from __future__ import annotations\n\nimport time\n", 1)
    path.write_text(text.replace(ANCHOR, ANCHOR + f"        time.sleep({ms / 1000!r})\n"))
    sh(GIT + ["commit", "-qam", f"pr36425: the poll sleeps {ms:g} ms"], repo)
    return sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()


def bench(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "bench", *args], repo, check=False)


def record_baseline(repo: Path, out: Path) -> Path:
    """A ci run of the base, made the baseline; this tree's gate settings kept."""
    run, baseline = out / "base_run", out / "baseline"
    if bench(repo, "run", "--preset", "ci", "--out", str(run)).returncode != 0:
        sys.exit("gate_power: the base's ci run failed")
    ours = json.loads((REPO / "results" / "baseline" / "gate.json").read_text())
    baseline.mkdir(parents=True)
    (baseline / "gate.json").write_text(json.dumps(
        {k: ours[k] for k in ("thresholds", "ab", "unresolved_ok") if k in ours}))
    done = bench(repo, "gate", str(run), "--baseline", str(baseline), "--update-baseline")
    if done.returncode != 0:
        sys.exit(f"gate_power: recording the baseline failed: {done.stdout[-500:]}")
    return baseline


def gate_once(repo: Path, rev: str, baseline: Path, out: Path) -> dict:
    """`bench run --preset ci` then `bench gate --ab` at `rev`, as make gate runs them."""
    sh(["git", "checkout", "-q", rev], repo)
    t0 = time.monotonic()
    run = out / f"run_{len(list(out.glob('run_*')))}"
    bench(repo, "run", "--preset", "ci", "--out", str(run))
    done = bench(repo, "gate", str(run), "--baseline", str(baseline), "--ab")
    rows = [line.split() for line in done.stdout.splitlines()]
    # the table lists failures, and beside them the UNRESOLVED checks gate.json allows
    failing = [f"{r[0]} {r[1]}/{r[2]}" for r in rows if done.returncode == 1 and len(r) > 2
               and r[0].endswith("_ab") and "UNRESOLVED" not in r]
    # "confirmation: H of F failing timing checks ..." only when the first A/B failed F
    confirm = re.search(r"^confirmation: (\d+) of (\d+) ", done.stdout, re.M)
    first = int(confirm.group(2)) if confirm else 0
    return {"rev": rev, "exit": done.returncode, "failing": failing, "run": str(run),
            "first_ab_failed": first,
            "unconfirmed": [line.split()[1] + " " + line.split()[2] for line in
                            done.stdout.splitlines() if "not confirmed by the second" in line],
            "seconds": round(time.monotonic() - t0, 1), "load_1m": os.getloadavg()[0],
            "last_line": (done.stdout.strip().splitlines() or [""])[-1]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    p.add_argument("--clean", type=int, default=5)
    p.add_argument("--slow-ms", default="0.1,0.25,0.5,1")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:  # "" or "none": clean gate runs only (false positives, no power)
        slow_ms = [float(x) for x in args.slow_ms.split(",")
                   if x.strip() and x.strip() != "none"]
    except ValueError:
        sys.exit(f"gate_power: --slow-ms takes a comma list of ms (or none), got "
                 f"{args.slow_ms!r}")
    if any(ms <= 0 for ms in slow_ms) or args.clean < 0:
        sys.exit("gate_power: --slow-ms values must be > 0 and --clean >= 0")
    if args.out is not None and args.out.exists() and (
            not args.out.is_dir() or any(args.out.iterdir())):
        sys.exit(f"gate_power: --out {args.out} is not an empty folder: pick a new one")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or REPO / "results" / f"gate_power_{stamp}").resolve()
    repo = out / "repo"
    out.mkdir(parents=True, exist_ok=True)
    head = sh(["git", "rev-parse", "HEAD"], REPO).stdout.strip()
    sh(["git", "clone", "-q", "--no-checkout", str(REPO), str(repo)], out)
    sh(GIT + ["checkout", "-q", "-B", "base", head], repo)
    slow = {ms: slow_commit(repo, ms) for ms in slow_ms}
    sh(["git", "checkout", "-q", "base"], repo)
    baseline = record_baseline(repo, out)
    results = []
    for label, rev in [*(("clean", "base") for _ in range(args.clean)),
                       *((f"slow {ms:g} ms", sha) for ms, sha in slow.items())]:
        r = gate_once(repo, rev, baseline, out) | {"label": label}
        results.append(r)
        print(f"gate_power: {label}: exit {r['exit']} ({r['seconds']:.0f}s, load "
              f"{r['load_1m']:.2f}), first A/B failed {r['first_ab_failed']} check(s): "
              f"{'; '.join(r['failing']) or r['last_line']}", flush=True)
    write_json_atomic(out / "gate_power.json", {"results": results, "cpu_count": os.cpu_count()})
    clean = [r for r in results if r["label"] == "clean"]
    caught = [f"{r['label']} {'caught' if r['exit'] == 1 else 'missed'}"
              f"{'' if r['first_ab_failed'] else ' (first A/B missed it)'}"
              for r in results if r["label"] != "clean"]
    print(f"gate_power: false positives {sum(r['exit'] != 0 for r in clean)} of {len(clean)} "
          f"({sum(r['first_ab_failed'] > 0 for r in clean)} of {len(clean)} by the first A/B "
          "alone)" + (f"; {', '.join(caught)}" if caught else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
