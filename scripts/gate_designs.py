"""Usage: python scripts/gate_designs.py pairs RUN_DIR [RUN_DIR ...] --out PAIRS_CSV
       python scripts/gate_designs.py simulate PAIRS_CSV [--design NAME=PROTOCOLS:BUDGET_S ...]
                                       [--gates 400] [--plants 0.05,0.10] [--seed 1]
                                       [--thresholds step_mean=0.03,...]

What the gate's timing rule would decide under other designs, from real served pairs.

`pairs` reads served A/B folders (a gate's ab/ folder or `bench ab --design served`: ab.json
and stages/) and writes one row per pair: the run, configuration, repeat, each gated
metric's log ratio ln(B/A), and the two serves' wall seconds (ranks.csv, rank 0).

`simulate` replays the gate on pairs drawn with replacement from that file, per design: the
configurations it serves and its seconds budget. A pair of a design costs the mean seconds
of a pair as the runs served it (their stages' seconds, starts included, over their
pairs), shared among the configurations
by their serves' wall seconds. Each simulated gate makes the t-mean's 95 % interval per
configuration and metric after each stage, decides it against the threshold
(bench.verdict.thresholds.decide), and adds stages by the gate's own rule
(bench.ab.sequential.more) from 12 pairs until no check is undecided, one FAILs, or the
budget is spent. A/As draw the pairs as they are; a plant adds ln(1 + share) to the step's
log ratios alone (the least a planted share of the step shows). Prints per design and kind
the share of gates that PASS, FAIL and stay undecided at the budget (a quiet machine FAILs
those), with the median seconds and pairs. Pairs are drawn independently, so a run's own
drift is not replayed: read the rates as the design's, then measure it (scripts/gate_power.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from estimators import GATED, pairs, stages_of  # noqa: E402

from bench.ab import sequential  # noqa: E402
from bench.analysis import estimate  # noqa: E402
from bench.verdict.thresholds import decide  # noqa: E402
from bench.verdict.words import FAIL, PASS, UNRESOLVED  # noqa: E402

METRICS = tuple(GATED)  # the ab's column names: step_mean_ms, itl_p50_ms, ...
FIRST = 12  # the gate's first stage (gate.json ab.repeats)


def read_pairs(runs: list[Path]) -> pd.DataFrame:
    """One row per (run, configuration, repeat): the metrics' log ratios and wall seconds."""
    frames = []
    for run in runs:
        stages = stages_of(run)
        per = pairs(run)
        seconds = sum(s["seconds"] for s in json.loads((run / "ab.json").read_text())["stages"])
        configs = sorted({(p, pol) for _, p, pol in per})
        for proto, pol in configs:
            cols = {m: per[(m, proto, pol)]["d"] for m in METRICS if (m, proto, pol) in per}
            if len(cols) < len(METRICS):
                continue
            frame = pd.DataFrame(cols).dropna()
            frame.insert(0, "repeat", frame.index)
            frame.insert(0, "config", f"{proto}/{pol}")
            frame.insert(0, "run", f"{run.parent.name}/{run.name}")
            frame["wall_a"] = _wall(stages, "a", proto, pol)
            frame["wall_b"] = _wall(stages, "b", proto, pol)
            frame["pair_s"] = seconds / len(frame)  # every configuration of the run's pair
            frames.append(frame)
    if not frames:
        raise ValueError("no served pairs in " + ", ".join(map(str, runs)))
    return pd.concat(frames, ignore_index=True)


def _wall(stages, side: str, proto: str, pol: str) -> float:
    walls = []
    for st in stages:
        r = pd.read_csv(st.dirs[side] / "ranks.csv")
        r = r[(r["protocol"] == proto) & (r["policy"] == pol) & (r["rank"] == 0)]
        walls.extend(r["wall_s"].tolist())
    return float(np.mean(walls)) if walls else math.nan


def pair_seconds(table: pd.DataFrame, configs: list[str]) -> float:
    """A design's pair: the runs' mean pair seconds shared by the configurations' walls."""
    wall = table.groupby("config")[["wall_a", "wall_b"]].mean().sum(axis=1)
    share = wall[configs].sum() / wall.sum()
    per_run = table.groupby("run")["pair_s"].first()
    return float(per_run.mean() * share)


def one_gate(draws: dict[str, np.ndarray], thresholds: dict[str, float], budget_s: float,
             pair_s: float) -> tuple[str, int, float]:
    n, spent, add = 0, 0.0, FIRST
    drawn = len(next(iter(draws.values())))  # the pairs drawn bound the repeats
    budget = sequential.Budget(drawn, budget_s)
    while add:
        n += add
        spent += add * pair_s
        states = []
        for d in draws.values():
            for j, m in enumerate(METRICS):
                e = estimate.t_mean(d[:n, j])
                t = thresholds[m]
                states.append((decide(e.low, e.high, t), e.point, e.low, e.high, t))
        add = sequential.more(states, n, spent, budget)
    verdicts = {s[0] for s in states}
    verdict = FAIL if FAIL in verdicts else PASS if verdicts == {PASS} else UNRESOLVED
    return verdict, n, spent


def simulate(table: pd.DataFrame, designs: dict[str, tuple[list[str], float]], gates: int,
             plants: list[float], thresholds: dict[str, float], seed: int) -> pd.DataFrame:
    rows = []
    for name, (configs, budget_s) in designs.items():
        pair_s = pair_seconds(table, configs)
        pools = {c: table[table["config"] == c][list(METRICS)].to_numpy() for c in configs}
        for share in [0.0, *plants]:
            rng = np.random.default_rng(seed)
            got = []
            for _ in range(gates):
                draws = {c: p[rng.integers(0, len(p), 400)].copy() for c, p in pools.items()}
                for d in draws.values():
                    d[:, 0] += math.log1p(share)
                got.append(one_gate(draws, thresholds, budget_s, pair_s))
            verdicts = pd.Series([g[0] for g in got])
            rows.append({"design": name, "kind": f"plant {share:.0%}" if share else "A/A",
                         "gates": gates, "PASS": (verdicts == PASS).mean(),
                         "FAIL": (verdicts == FAIL).mean(),
                         "undecided": (verdicts == UNRESOLVED).mean(),
                         "median s": float(np.median([g[2] for g in got])),
                         "median pairs": float(np.median([g[1] for g in got])),
                         "pair s": pair_s})
    return pd.DataFrame(rows)


def parse_design(text: str, known: set[str]) -> tuple[str, tuple[list[str], float]]:
    name, sep, rest = text.partition("=")
    protos, sep2, budget = rest.rpartition(":")
    if not (sep and sep2 and name and protos):
        raise ValueError(f"--design {text!r}: want NAME=PROTOCOL[,PROTOCOL...]:BUDGET_S")
    configs = [p if "/" in p else f"{p}/wait_complete" for p in protos.split(",")]
    unknown = [c for c in configs if c not in known]
    if unknown:
        raise ValueError(f"--design {text!r}: no pairs of {', '.join(unknown)} (have "
                         f"{', '.join(sorted(known))})")
    return name, (configs, float(budget))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[3])
    sub = p.add_subparsers(dest="verb", required=True)
    pp = sub.add_parser("pairs")
    pp.add_argument("runs", type=Path, nargs="+")
    pp.add_argument("--out", type=Path, required=True)
    sp = sub.add_parser("simulate")
    sp.add_argument("pairs_csv", type=Path)
    sp.add_argument("--design", action="append", default=[])
    sp.add_argument("--gates", type=int, default=400)
    sp.add_argument("--plants", default="0.05,0.10")
    sp.add_argument("--seed", type=int, default=1)
    sp.add_argument("--thresholds", default="step_mean=0.03,itl_p50=0.05,"
                    "prefetch_ttft_p50=0.05,bystander_ttft_p50=0.10")
    args = p.parse_args(argv)
    try:
        if args.verb == "pairs":
            table = read_pairs(args.runs)
            table.to_csv(args.out, index=False, float_format="%.6g")
            print(f"{len(table)} pairs of {table['run'].nunique()} runs -> {args.out}")
            return 0
        table = pd.read_csv(args.pairs_csv)
        known = set(table["config"])
        designs = dict(parse_design(d, known) for d in args.design) or {
            "both": (sorted(known), 420.0)}
        th = {f"{k}_ms": float(v) for k, v in
              (x.split("=") for x in args.thresholds.split(",") if x)}
        if set(th) != set(METRICS):
            raise ValueError(f"--thresholds must name {', '.join(m[:-3] for m in METRICS)}")
        plants = [float(x) for x in args.plants.split(",") if x]
        if args.gates < 1:
            raise ValueError("--gates must be >= 1")
    except (ValueError, OSError, KeyError) as e:
        print(f"gate_designs: {e}", file=sys.stderr)
        return 2
    out = simulate(table, designs, args.gates, plants, th, args.seed)
    print(out.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
