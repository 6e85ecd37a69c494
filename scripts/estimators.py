"""Usage: python scripts/estimators.py RUN_DIR [RUN_DIR ...] [--windows 12,24,48]
                                  [--gate results/baseline/gate.json] [--aa NAME,...]
                                  [--json FILE]
       python scripts/estimators.py --replay GATE_DIR [GATE_DIR ...]
                                  [--gate results/baseline/gate.json]

Compares the served A/B's interval methods (bench.analysis.estimate) offline, on served A/B run
directories (`bench ab --design served` or a gate's ab/ folder: ab.json and stages/). Per
run, gated metric and configuration, the pairs (one serve of A and one of B per repeat) are
cut into consecutive windows of 12, 24, 48 pairs; per window and method the interval is
made at 95 % and at the level the planned looks' alpha spending gives a look of that many
pairs (bench.ab.sequential, looks 12/24/48/80). Prints per method and window size: the
windows, the median half-width (95 % and spent), and how often the interval excludes 1
(on an A/A: a false alarm; at 95 % and at the spent level), lies wholly above 1 (on a plant:
the change seen), decides PASS or FAIL against gate.json's thresholds (spent level), and
the median half-width against the t-mean's on the same window; then the same pooled over
the runs, metrics and configurations, A/As apart. A run directory whose name starts with
`aa` (or is listed in --aa) is an A/A.
Also prints each run's disturbance: ranks.csv cpu_lost per serve (the machine's CPU lost to
steal and other processes). --json FILE writes every row. Exit 2 on a folder that is no
served A/B.

--replay judges recorded gates again, one per GATE_DIR (a gate's run folder whose ab/ holds
the served pairs, e.g. scripts/gate_power.py's gates/NN_kind): at each of the gate's own
stage ends, each method's 95 % interval per gated check against gate.json's thresholds, as
the sequential rule reads them (FAIL when a check FAILs, PASS when every check PASSes, else
the next stage). Per gate and method: the verdict, the pairs it took, the step's ratio and
half-width; UNDECIDED where the gate's pairs ran out first (its budget spent, or the gate
itself decided sooner). Then per kind (the folder's name less its leading number) the
counts of each verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ab import sequential  # noqa: E402
from bench.ab.served import Stage, merged  # noqa: E402
from bench.analysis import estimate  # noqa: E402
from bench.compare.metrics import TIMING_METRICS  # noqa: E402
from bench.verdict.thresholds import decide  # noqa: E402

GATED = {"step_mean_ms": "step_mean", "itl_p50_ms": "itl_p50",
         "prefetch_ttft_p50_ms": "prefetch_ttft_p50",
         "bystander_ttft_p50_ms": "bystander_ttft_p50"}
LOOKS = (12, 24, 48, 80)
METHODS = ("t-mean", "hl-wilcoxon", "cpu-adjusted", "drop-disturbed")
REPLAYED = ("t-mean", "cpu-adjusted", estimate.SERVED)


def stages_of(run: Path) -> list[Stage]:
    path = run / "ab.json"
    if not path.is_file():
        raise ValueError(f"{run}: no ab.json (not a served A/B)")
    rec = json.loads(path.read_text())
    if rec.get("design") != "served":
        raise ValueError(f"{run}: ab.json's design is {rec.get('design')!r}, not served")
    return [Stage(s["index"], s["seed"], s["repeats"], {k: Path(v) for k, v in s["dirs"].items()})
            for s in rec["stages"]]


def serves(stages: list[Stage], side: str) -> pd.DataFrame:
    """Per (protocol, policy, repeat) of one side: cpu_lost (rank 0's) and cpu_s (ranks')."""
    frames, offset = [], 0
    for st in stages:
        r = pd.read_csv(st.dirs[side] / "ranks.csv")
        r = r.assign(repeat=offset + r["repeat"].astype(int))
        g = r.groupby(["protocol", "policy", "repeat"])
        frames.append(pd.DataFrame({"lost": g["cpu_lost"].first(), "cpu": g["cpu_s"].sum()}))
        offset += st.repeats
    return pd.concat(frames)


def pairs(run: Path) -> dict[tuple[str, str, str], pd.DataFrame]:
    """(metric, protocol, policy) -> per repeat: d = ln(b/a), lost_a, lost_b, cpu_a, cpu_b."""
    stages = stages_of(run)
    sides = {s: merged(stages, s) for s in "ab"}
    cov = serves(stages, "a").add_suffix("_a").join(serves(stages, "b").add_suffix("_b"))
    out = {}
    for m in TIMING_METRICS:
        if m.name not in GATED:
            continue
        per = {}
        for s, run_ in sides.items():
            frame = run_.table(m.table)
            if frame is None or not m.present(frame.columns):
                break
            for key, g in frame.groupby(["protocol", "policy"]):
                per.setdefault(key, {})[s] = m.sample(g).per_repeat(m.stat)
        for (proto, pol), both in per.items():
            if len(both) < 2:
                continue
            reps = sorted(r for r in set(both["a"]) & set(both["b"])
                          if both["a"][r] > 0 and both["b"][r] > 0)
            if not reps:
                continue
            d = pd.DataFrame({"d": [np.log(both["b"][r] / both["a"][r]) for r in reps]},
                             index=pd.Index(reps, name="repeat"))
            c = cov.xs((proto, pol), level=("protocol", "policy"))
            out[(m.name, proto, pol)] = d.join(c, how="left")
    return out


def methods(p: pd.DataFrame, level: float) -> dict[str, estimate.Estimate]:
    d = p["d"].to_numpy()
    return {"t-mean": estimate.t_mean(d, level),
            "hl-wilcoxon": estimate.hodges_lehmann(d, level),
            "cpu-adjusted": estimate.cpu_adjusted(
                d, (p["lost_b"] - p["lost_a"]).fillna(0).to_numpy(), level),
            "drop-disturbed": estimate.drop_disturbed(d, p["lost_a"], p["lost_b"], level),
            "cpu-time": estimate.cpu_time(p["cpu_a"], p["cpu_b"], level),
            estimate.SERVED: methods_by_disturbance(p, level)}


def methods_by_disturbance(p: pd.DataFrame, level: float) -> estimate.Estimate:
    """The served A/B's own choice (bench.analysis.estimate.method_for) over these pairs."""
    name = estimate.method_for([*p["lost_a"].dropna(), *p["lost_b"].dropna()])
    d, x = p["d"].to_numpy(), (p["lost_b"] - p["lost_a"]).fillna(0).to_numpy()
    return estimate.METHODS[name](d, x, level)


def replay(gate: Path, thresholds: dict) -> list[dict]:
    """One recorded gate judged again by each method at its own stage ends."""
    run = gate / "ab" if (gate / "ab" / "ab.json").is_file() else gate
    ends = np.cumsum([s.repeats for s in stages_of(run)])
    found = pairs(run)
    # every method's intervals of each check at each stage end, made once
    made = {(key, n): methods(p.iloc[:n], 0.95) for key, p in found.items() for n in ends}
    out = []
    for name in REPLAYED:
        verdict, at, step = "UNDECIDED", int(ends[-1]), None
        for n in ends:
            states = []
            for key in found:
                metric, e = key[0], made[(key, n)][name]
                states.append(decide(e.low, e.high, thresholds.get(GATED[metric], 0.05))
                              if e.has_interval else "NOT JUDGED")
                step = e if metric == "step_mean_ms" else step
            if "FAIL" in states or all(s == "PASS" for s in states):
                verdict, at = ("FAIL" if "FAIL" in states else "PASS"), int(n)
                break
        out.append({"gate": gate.name, "kind": gate.name.lstrip("0123456789_"),
                    "method": name, "verdict": verdict, "pairs": at,
                    "step": None if step is None else round(step.point, 3),
                    "step_half": None if step is None else step.half_width})
    return out


def replay_tables(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    each = rows.pivot(index="gate", columns="method", values=["verdict", "pairs"])
    counts = rows.groupby(["kind", "method", "verdict"]).size().unstack(fill_value=0)
    return each, counts


def rows_of(run: Path, windows: list[int], thresholds: dict, aa: bool) -> list[dict]:
    out = []
    for (metric, proto, pol), p in pairs(run).items():
        t = thresholds.get(GATED[metric], 0.05)
        for w in windows:
            level = sequential.look_level(w, LOOKS)
            for i in range(len(p) // w):
                win = p.iloc[i * w:(i + 1) * w]
                plain, spent = methods(win, 0.95), methods(win, level)
                for name in (*METHODS, "cpu-time"):
                    if name == "cpu-time" and metric != "step_mean_ms":
                        continue  # one CPU measure per configuration, shown once
                    e, s = plain[name], spent[name]
                    out.append({"run": run.name, "aa": aa, "metric": metric, "config":
                                f"{proto}/{pol}", "window": w, "start": i * w, "method": name,
                                "threshold": t, "point": e.point, "half": e.half_width,
                                "kept": e.kept, "excl": e.has_interval
                                and not e.low <= 1 <= e.high, "half_spent": s.half_width,
                                "excl_spent": s.has_interval and not s.low <= 1 <= s.high,
                                "state": decide(s.low, s.high, t)})
    return out


def disturbance(run: Path) -> str:
    stages = stages_of(run)
    lost = pd.concat([serves(stages, s)["lost"] for s in "ab"])
    return (f"{run.name}: {len(lost)} serves, cpu_lost median {lost.median():.3f}, mean "
            f"{lost.mean():.3f}, p90 {lost.quantile(0.9):.3f}, above 0.05: "
            f"{(lost > 0.05).mean():.0%}, above {estimate.DROP_LIMIT}: "
            f"{(lost > estimate.DROP_LIMIT).mean():.0%}")


def table(rows: pd.DataFrame) -> pd.DataFrame:
    g = rows.groupby(["run", "metric", "method", "window"], sort=False)
    return pd.DataFrame({
        "windows": g.size(), "half95": g["half"].median(), "half_spent": g["half_spent"].median(),
        "excl1": g["excl"].mean(), "pass": g["state"].apply(lambda s: (s == "PASS").mean()),
        "fail": g["state"].apply(lambda s: (s == "FAIL").mean()),
        "kept": g["kept"].mean()})


def pooled(rows: pd.DataFrame) -> pd.DataFrame:
    """Per kind (A/A or not), method and window size over every run, metric and
    configuration: the windows, the median half-width against the t-mean's of the same
    window, how often the interval excludes 1 (A/A: a false alarm; else: the change seen),
    lies wholly above 1, and decides PASS / FAIL at the spent level."""
    base = rows[rows["method"] == "t-mean"].set_index(["run", "metric", "config", "window",
                                                        "start"])["half"]
    rows = rows.join(base.rename("t_half"), on=["run", "metric", "config", "window", "start"])
    rows = rows.assign(vs_t=rows["half"] / rows["t_half"],
                       above=[bool(e) and p > 1 for e, p in zip(rows["excl"], rows["point"],
                                                                  strict=True)])
    g = rows.groupby(["aa", "method", "window"], sort=False)
    return pd.DataFrame({"windows": g.size(), "half95": g["half"].median(),
                         "vs_t_mean": g["vs_t"].median(), "half_spent": g["half_spent"].median(),
                         "excl1": g["excl"].mean(), "excl_spent": g["excl_spent"].mean(),
                         "above1": g["above"].mean(),
                         "pass": g["state"].apply(lambda s: (s == "PASS").mean()),
                         "fail": g["state"].apply(lambda s: (s == "FAIL").mean())})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="estimators.py", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--windows", default="12,24,48")
    ap.add_argument("--gate", type=Path, default=REPO / "results" / "baseline" / "gate.json")
    ap.add_argument("--aa", default="")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        windows = [int(x) for x in args.windows.split(",")]
        thresholds = json.loads(args.gate.read_text())["thresholds"]
        if args.replay:
            return print_replay([r for g in args.runs for r in replay(g, thresholds)])
        rows = []
        for run in args.runs:
            aa = run.name.startswith("aa") or run.name in args.aa.split(",")
            rows += rows_of(run, windows, thresholds, aa)
            print(disturbance(run))
    except (ValueError, OSError, KeyError) as e:
        print(f"estimators: {e}", file=sys.stderr)
        return 2
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_rows", 1000,
                           "display.float_format", "{:.3f}".format):
        print(table(frame).to_string())
        print(pooled(frame).to_string())
    if args.json:
        args.json.write_text(frame.to_json(orient="records", indent=0))
    return 0


def print_replay(rows: list[dict]) -> int:
    each, counts = replay_tables(pd.DataFrame(rows))
    with pd.option_context("display.width", 200, "display.max_rows", 1000):
        print(each.to_string())
        print(counts.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
