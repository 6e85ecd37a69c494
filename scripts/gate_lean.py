"""Usage: python scripts/gate_lean.py STUDY [STUDY ...]

Does a served A/B lean when both sides run the same code? Reads the gates of studies made
by scripts/gate_power.py (their folders) and prints, per protocol, from the mean step time of
every pair (one repeat served by A and by B):

- the lean: over the quiet A/As' pairs, the mean B/A with its 95 % t interval;
- carry-over: whether a serve right after its own side's serve is slower or faster (the
  slope of B/A on B-followed-itself minus A-followed-itself, each gate's own mean removed),
  and how far the turn orders served left that unbalanced (its mean over the A/As' pairs);
- a stage's last pair (each gate's own mean removed), where B served first and where A did:
  the side that serves a stage's last turn is the one whose serve may overlap the other
  side's end of run;
- the machine's other CPU (ranks.csv other_cpu_s over wall_s, B minus A)
  as a covariate: the share of the A/As' pair spread it explains, and what adjusting by it
  (the A/As' slope) does to the planted gates' B/A. A covariate that moves with the
  regression itself shrinks the regression, and then it must not adjust a gate.

The serve order is read from the serves' own clocks (steps.csv t_s, one monotonic clock on
one machine), not from the plan. Needs scipy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

KEY = ["protocol", "repeat"]


def serves(run: Path) -> pd.DataFrame:
    """One side's serves of one stage: mean step time, start, and the machine's other CPU
    while it ran (cores' worth: other_cpu_s over wall_s, the mean over its ranks)."""
    steps = pd.read_csv(run / "steps.csv", usecols=[*KEY, "t_s", "step_ms"])
    out = steps.groupby(KEY).agg(step_ms=("step_ms", "mean"), start=("t_s", "min"))
    ranks = pd.read_csv(run / "ranks.csv", usecols=[*KEY, "other_cpu_s", "wall_s"])
    ranks["other"] = ranks["other_cpu_s"] / ranks["wall_s"]
    return out.join(ranks.groupby(KEY)["other"].mean())


def pairs(gate: Path) -> pd.DataFrame:
    """Every pair of a gate: protocol, log B/A of the mean step, `follows` (1 where only B's
    serve came right after its own side's serve, -1 where only A's did) and `d_other`."""
    rows = []
    for stage in json.loads((gate / "ab" / "ab.json").read_text())["stages"]:
        side = {s: serves(Path(stage["dirs"][s])).assign(side=s) for s in "ab"}
        order = pd.concat(side.values()).sort_values("start")
        after_self = order["side"].eq(order["side"].shift())
        follows = {(s, *k): int(v) for k, s, v in zip(order.index, order["side"], after_self,
                                                      strict=True)}
        a, b = side["a"], side["b"]
        pair = pd.DataFrame({"y": np.log(b["step_ms"] / a["step_ms"]),
                             "d_other": b["other"] - a["other"],
                             "b_first": (b["start"] < a["start"]).astype(int)}).reset_index()
        pair["follows"] = [follows[("b", p, r)] - follows[("a", p, r)]
                           for p, r in zip(pair["protocol"], pair["repeat"], strict=True)]
        pair["stage"] = stage["index"]
        rows.append(pair)
    return pd.concat(rows, ignore_index=True)


def gates(studies: list[Path]) -> pd.DataFrame:
    """Every pair of every gate of the studies, with its gate's label (A/A quiet, plant 5%,
    ...) and folder."""
    out = []
    for study in studies:
        for r in json.loads((study / "gate_power.json").read_text())["results"]:
            if (Path(r["dir"]) / "ab" / "ab.json").is_file():
                out.append(pairs(Path(r["dir"])).assign(label=r["label"], gate=r["dir"]))
    if not out:
        raise ValueError("no gate with an ab.json in these studies")
    return pd.concat(out, ignore_index=True)


def report(d: pd.DataFrame) -> list[str]:
    from scipy import stats

    d = d.assign(centred=d["y"] - d.groupby(["gate", "protocol"])["y"].transform("mean"),
                 last=d["repeat"] == d.groupby(["gate", "stage"])["repeat"].transform("max"))
    aa = d[d["label"] == "A/A quiet"]
    lines = ["| protocol | A/A pairs | lean B/A [95% CI] | carry-over: B/A per serve after its "
             "own [95% CI] | its imbalance in the A/As | a stage's last pair, B first / A "
             "first | other CPU explains | adjusted plants (raw -> adjusted B/A) |",
             "|---|---|---|---|---|---|---|---|"]
    for protocol, x in aa.groupby("protocol"):
        lean = stats.ttest_1samp(x["y"], 0)
        ci = lean.confidence_interval()
        every = d[d["protocol"] == protocol]
        carry = stats.linregress(every["follows"], every["centred"])
        half = stats.t.ppf(0.975, len(every) - 2) * carry.stderr
        cov = stats.linregress(x["d_other"], x["y"])
        plants = every[every["label"].str.startswith("plant")]
        adjusted = plants.assign(adj=plants["y"] - cov.slope * plants["d_other"]).groupby(
            "label", sort=False)[["y", "adj"]].mean()
        shifts = ", ".join(f"{lab} {np.expm1(v.y):+.1%} -> {np.expm1(v.adj):+.1%}"
                           for lab, v in adjusted.iterrows())
        last = every[every["last"]].groupby("b_first")["centred"]
        ends = " / ".join(f"{np.expm1(last.mean()[b]):+.1%} ({last.size()[b]})"
                          if b in last.size() else "- (0)" for b in (1, 0))
        lines.append(
            f"| {protocol} | {len(x)} | {np.expm1(x['y'].mean()):+.2%} [{np.expm1(ci.low):+.2%},"
            f" {np.expm1(ci.high):+.2%}] | {np.expm1(carry.slope):+.2%} "
            f"[{np.expm1(carry.slope - half):+.2%}, {np.expm1(carry.slope + half):+.2%}] | "
            f"{x['follows'].mean():+.3f} | {ends} | {cov.rvalue ** 2:.0%} | {shifts or '-'} |")
    return lines


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    missing = [a for a in argv if not (Path(a) / "gate_power.json").is_file()]
    if missing:
        print(f"gate_lean: {missing[0]} holds no gate_power.json: not a study", file=sys.stderr)
        return 2
    try:
        print("\n".join(report(gates([Path(a) for a in argv]))))
    except (ValueError, OSError, KeyError) as e:
        print(f"gate_lean: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
