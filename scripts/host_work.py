"""Usage: python scripts/host_work.py [--aa 6] [--shares 1,3,5,10] [--modes calls,opcodes]
                                    [--out DIR]
       python scripts/host_work.py --record RUN [--baseline results/baseline]

Does a count of the scheduler thread's host work hold where timings do not?
Runs short `bench run --preset ci` serves of pr27010 and pr36425 under wait_complete with
`--host-work MODE` (bench.run.host_profile) and reads three candidates from ranks.csv, each the
largest over the two ranks: Python events per step and per poll (the counted serve), and the
scheduler thread's CPU microseconds per step (the timed serve, no profiler).

- A/A: --aa runs per mode, as the machine is (loaded or not: each run's load average is
  kept); the spread of each candidate is (max - min) / median over the runs.
- Power: plants on pr36425 sized as a share of its A/A step time (1, 3, 5, 10 %): work (N
  extra Python calls in its first poll of each step, N = share x step / the time of one such
  call measured here) and time (a spin of share x step ms, the existing --plant). A
  plant is seen by a count when it exceeds the A/A largest by the gate's tolerance
  (bench.gate.host_ceiling.TOLERANCE), by the CPU time when it exceeds the A/A largest.

Writes runs under --out (default results/host_work_<UTC time>) and host_work.json there;
prints the tables. About 30 s a run on 2 cores loaded by others (load average 5-11).

--record RUN writes the ceilings of a `bench run --preset ci --host-work calls` run (all
protocols and policies) into the baseline's gate.json `host_work`, leaving the rest of the
baseline as it is (`bench gate --update-baseline` records them too, with everything else).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.gate.host_ceiling import TOLERANCE, with_ceilings  # noqa: E402
from bench.rundir.files import write_json_atomic  # noqa: E402
from bench.rundir.rundir import RunDir  # noqa: E402
from hicache.cache.twin import _work  # noqa: E402

BASE = ["--preset", "ci", "--protocols", "pr27010,pr36425", "--policies", "wait_complete"]
PLANTED = "pr36425"
CANDIDATES = ("events_per_step", "poll_events_per_poll", "cpu_us_per_step")


def serve(out: Path, mode: str, *extra: str) -> dict:
    """One run; per protocol each candidate (the largest over ranks) and the run's facts."""
    load0 = os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-m", "bench", "run", *BASE, "--host-work", mode,
                           *extra, "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"host_work: run {out} failed: {done.stderr.strip()[-800:]}")
    ranks, steps = pd.read_csv(out / "ranks.csv"), pd.read_csv(out / "steps.csv")
    ranks["events_per_step"] = ranks["host_events"] / ranks["host_steps"]
    ranks["poll_events_per_poll"] = ranks["host_poll_events"] / ranks["host_polls"]
    ranks["cpu_us_per_step"] = ranks["sched_cpu_s"] / ranks["sched_steps"] * 1e6
    by = ranks.groupby("protocol")
    return {"run": out.name, "mode": mode, "extra": list(extra), "load_1m": load0,
            "cpu_lost": float(ranks["cpu_lost"].max()),
            "step_ms": steps.groupby("protocol")["step_ms"].mean().to_dict(),
            **{c: by[c].max().to_dict() for c in CANDIDATES}}


def ns_per_call() -> float:
    return min(timeit.repeat(lambda: _work(10_000), number=20, repeat=7)) / 20 / 10_000 * 1e9


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def aa_table(aa: list[dict]) -> list[str]:
    lines = ["| mode | protocol | candidate | runs | median | min | max | spread |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in dict.fromkeys(r["mode"] for r in aa):
        runs = [r for r in aa if r["mode"] == mode]
        for proto in ("pr27010", PLANTED):
            for c in CANDIDATES:
                v = [r[c][proto] for r in runs]
                lines.append(f"| {mode} | {proto} | {c} | {len(v)} | {statistics.median(v):.2f}"
                             f" | {min(v):.2f} | {max(v):.2f} | {spread(v):.3%} |")
    return lines


def plant_table(aa: list[dict], plants: list[dict]) -> list[str]:
    lines = ["| mode | plant | share | size | candidate | value | x A/A median | seen |",
             "|---|---|---|---|---|---|---|---|"]
    for p in plants:
        ref = [r for r in aa if r["mode"] == p["mode"]]
        for c in CANDIDATES:
            v = [r[c][PLANTED] for r in ref]
            top = max(v) * ((1 + TOLERANCE) if c != "cpu_us_per_step" else 1)
            got = p[c][PLANTED]
            lines.append(f"| {p['mode']} | {p['kind']} | {p['share']:g} % | {p['size']} | {c} "
                         f"| {got:.2f} | {got / statistics.median(v):.3f} "
                         f"| {'yes' if got > top else 'no'} |")
    return lines


def record(run: Path, baseline: Path) -> None:
    """The run's host-work ceilings into the baseline's gate.json (the rest kept)."""
    path = RunDir(baseline).file("gate")
    settings = json.loads(path.read_text())
    new = with_ceilings(settings, RunDir(run).ranks(), run.resolve().name)
    if new is settings:
        sys.exit(f"host_work: {run} counted no host work (bench run --host-work calls)")
    write_json_atomic(path, new)
    print(f"{path}: host_work ceilings of {len(new['host_work']['ceilings'])} protocols "
          f"from {run}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=6)
    ap.add_argument("--shares", default="1,3,5,10")
    ap.add_argument("--modes", default="calls,opcodes")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--record", type=Path, metavar="RUN")
    ap.add_argument("--baseline", type=Path, default=REPO / "results" / "baseline")
    args = ap.parse_args()
    if args.record:
        return record(args.record, args.baseline)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / "results" / f"host_work_{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    aa = []
    for i in range(args.aa):  # modes interleaved: each sees the same stretch of load
        for mode in modes:
            aa.append(serve(out / f"aa_{mode}_{i}", mode))
            print(json.dumps(aa[-1]), flush=True)
    step_ms = statistics.median(r["step_ms"][PLANTED] for r in aa)
    ns = ns_per_call()
    plants = []
    for share in (float(s) for s in args.shares.split(",")):
        ms = share / 100 * step_ms
        calls = round(ms * 1e6 / ns)
        for mode in modes:
            r = serve(out / f"work_{share:g}_{mode}", mode, "--plant", f"{PLANTED}:{calls}calls")
            plants.append({**r, "kind": "work", "share": share, "size": f"{calls} calls"})
            print(json.dumps(plants[-1]), flush=True)
        r = serve(out / f"spin_{share:g}", "calls", "--plant", f"{PLANTED}:{ms:.4f}")
        plants.append({**r, "kind": "spin", "share": share, "size": f"{ms:.3f} ms"})
        print(json.dumps(plants[-1]), flush=True)
    facts = {"step_ms": step_ms, "ns_per_planted_call": ns, "tolerance": TOLERANCE,
             "aa": aa, "plants": plants}
    (out / "host_work.json").write_text(json.dumps(facts, indent=1))
    print(f"pr36425 step {step_ms:.2f} ms (A/A median), one planted call {ns:.1f} ns")
    print("\n".join(aa_table(aa) + [""] + plant_table(aa, plants)))


if __name__ == "__main__":
    main()
