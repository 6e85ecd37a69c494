"""Usage: python scripts/aa_runs.py [--runs 5] [--rev HEAD] [--seed-step 100] [--out DIR]
                                  [-- AB_ARGS...]

A/A runs of `bench ab`: the same code on both sides, so every "worse" or "better" is a false
call, every order-effect warning a side or a position the instrument favours. Runs --runs
times `bench ab REV REV` (both sides detached worktrees of one commit) and --runs times
`bench ab REV WORKTREE` (this tree snapshotted; it must equal REV for an A/A, so the tree
must be clean), alternating the two kinds, each with the gate's A/B settings
(results/baseline/gate.json `ab`: preset, protocols, policies, blocks) unless AB_ARGS after
`--` replace them. A/B i runs with `--seed i x --seed-step`, so each A/B draws its own
order of sides (with one seed every A/B would run the same sequence, and an effect of a
slot in that sequence would look like a side's; --seed-step 0 does that). Then, over all
runs and per kind: the share of timing verdicts "same"
(every timing row, and the gated ones), per gated metric how many runs had its order-effect
interval holding 1 and how many had all blocks on one side. Writes aa_runs.json and
aa_runs.md into --out (default results/aa_<UTC time>). About 2.5 minutes per A/B with the
gate's settings on 2 cores; measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.report.printer import markdown_table  # noqa: E402
from bench.rundir.files import write_json_atomic  # noqa: E402
from bench.rundir.schema import GATED_METRICS  # noqa: E402

GATED = {f"{m}_ms" for m in GATED_METRICS}


def gate_ab_args() -> list[str]:
    """results/baseline/gate.json's `ab` settings as bench ab flags."""
    ab = json.loads((REPO / "results" / "baseline" / "gate.json").read_text())["ab"]
    args = ["--preset", ab["preset"], "--repeats", str(ab.get("blocks", 6))]
    for key in ("protocols", "policies"):
        if ab.get(key):
            args += [f"--{key}", ab[key]]
    return args


def one_ab(rev: str, b: str, kind: str, out: Path, args: list[str]) -> dict:
    """One `bench ab` of the `kind` ("X X" or "X WORKTREE") and what its ab.csv says."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bench", "ab", rev, b, *args, "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True)
    seconds = round(time.monotonic() - t0, 1)
    table = out / "ab.csv"
    if not table.exists():
        sys.exit(f"aa_runs: bench ab {rev} {b} wrote no ab.csv (exit {done.returncode}): "
                 f"{done.stderr.strip()[-500:]}")
    return {"kind": kind, "exit": done.returncode, "seconds": seconds,
            "out": str(out), "last_line": (done.stdout.strip().splitlines() or [""])[-1],
            **read_ab(pd.read_csv(table))}


def read_ab(rows: pd.DataFrame) -> dict:
    """From one ab.csv: how many timing rows (all, gated) said "same", and per gated row its
    verdict, its order-effect interval and the blocks' sides."""
    timing = rows[rows["kind"] == "timing"]
    gated = timing[timing["metric"].isin(GATED)]
    order = []
    for r in gated.to_dict("records"):
        if pd.isna(r.get("second_over_first")):
            continue
        holds = bool(r["order_ci_low"] <= 1 <= r["order_ci_high"])
        n = int(r["blocks_favour_a"] + r["blocks_favour_b"])
        one_side = n >= 3 and max(r["blocks_favour_a"], r["blocks_favour_b"]) == n
        order.append({"config": f"{r['protocol']}/{r['policy']}", "metric": r["metric"],
                      "ratio": r["ratio_b_over_a"], "low": r["ratio_ci_low"],
                      "high": r["ratio_ci_high"], "verdict": r["verdict"],
                      "second_over_first": r["second_over_first"],
                      "order_low": r["order_ci_low"], "order_high": r["order_ci_high"],
                      "order_holds_1": holds, "one_side": bool(one_side),
                      "favour_a": int(r["blocks_favour_a"]),
                      "favour_b": int(r["blocks_favour_b"])})
    return {"timing_rows": len(timing), "timing_same": int((timing["verdict"] == "same").sum()),
            "gated_rows": len(gated), "gated_same": int((gated["verdict"] == "same").sum()),
            "gated": order}


def summary(results: list[dict]) -> list[str]:
    """aa_runs.md: per kind the share of "same", per gated metric the order effect."""
    lines = ["# A/A runs of bench ab", ""]
    kinds = sorted({r["kind"] for r in results}) + ["all"]
    table = []
    for kind in kinds:
        rs = [r for r in results if kind in ("all", r["kind"])]
        t, ts = sum(r["timing_rows"] for r in rs), sum(r["timing_same"] for r in rs)
        g, gs = sum(r["gated_rows"] for r in rs), sum(r["gated_same"] for r in rs)
        table.append([kind, str(len(rs)), f"{ts}/{t} ({ts / max(t, 1):.1%})",
                      f"{gs}/{g} ({gs / max(g, 1):.1%})"])
    lines += [markdown_table(["runs", "n", "timing 'same'", "gated 'same'"], table), ""]
    per = {}
    for r in results:
        for g in r["gated"]:
            per.setdefault((g["config"], g["metric"]), []).append(g)
    rows = [[c, m, f"{sum(x['order_holds_1'] for x in xs)}/{len(xs)}",
             f"{sum(x['one_side'] for x in xs)}/{len(xs)}",
             f"{sum(x['verdict'] == 'same' for x in xs)}/{len(xs)}"]
            for (c, m), xs in sorted(per.items())]
    lines += [markdown_table(["configuration", "metric", "order interval holds 1",
                              "all blocks one side", "same"], rows), ""]
    lines += ["Per run:", ""]
    lines += [markdown_table(["#", "runs", "exit", "s", "last line"],
                             [[str(i), r["kind"], str(r["exit"]), f"{r['seconds']:.0f}",
                               r["last_line"]] for i, r in enumerate(results)]), ""]
    return lines


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1:] if "--" in argv else None
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    p.add_argument("--runs", type=int, default=5, help="A/Bs of each kind (default 5)")
    p.add_argument("--rev", default="HEAD", help="the commit on both sides (default HEAD)")
    p.add_argument("--seed-step", type=int, default=100,
                   help="A/B i runs --seed i x this (default 100; 0: every A/B seed 0)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.runs < 1 or args.seed_step < 0:
        p.error("--runs must be at least 1 and --seed-step at least 0")
    if args.out is not None and args.out.exists() and (
            not args.out.is_dir() or any(args.out.iterdir())):
        sys.exit(f"aa_runs: --out {args.out} is not an empty folder: pick a new one")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        sys.exit("aa_runs: the working tree has uncommitted changes: REV WORKTREE would not "
                 "be an A/A; commit or stash them")
    rev = subprocess.run(["git", "rev-parse", args.rev], cwd=REPO, capture_output=True,
                         text=True)
    if rev.returncode != 0:
        sys.exit(f"aa_runs: unknown revision {args.rev}")
    sha = rev.stdout.strip()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or REPO / "results" / f"aa_{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    ab_args = extra if extra is not None else gate_ab_args()
    results = []
    for i in range(2 * args.runs):
        b = sha if i % 2 == 0 else "WORKTREE"
        seed = [] if "--seed" in ab_args else ["--seed", str(i * args.seed_step)]
        r = one_ab(sha, b, "X X" if b == sha else "X WORKTREE",
                   out / f"{i:02d}_{'same' if b == sha else 'tree'}", [*ab_args, *seed])
        results.append(r)
        flagged = [f"{g['config']} {g['metric']}" for g in r["gated"]
                   if not g["order_holds_1"] or g["one_side"]]
        print(f"aa_runs: [{i + 1}/{2 * args.runs}] {r['kind']}: exit {r['exit']} "
              f"({r['seconds']:.0f}s) {r['last_line']}; order/side flags: "
              f"{', '.join(flagged) or 'none'}", flush=True)
    write_json_atomic(out / "aa_runs.json", {"rev": sha, "ab_args": ab_args,
                                             "results": results})
    (out / "aa_runs.md").write_text("\n".join(
        [*summary(results), f"Commit {sha}; bench ab {' '.join(ab_args)}."]) + "\n")
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
