"""The tables of scripts/gate_power.py, from a study's gates: per kind the gates that ended
FAIL, INCONCLUSIVE and PASS (each gate's decision.json, bench.rundir.decision), a row per gate
(its pairs, seconds, the CPU its serves lost, each protocol's step interval), and the budget
the quiet A/As ask for. Usage: through gate_power.py (--tables DIR ...)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ab import sequential  # noqa: E402
from bench.rundir import decision  # noqa: E402

GATED = ("step_mean", "itl_p50", "prefetch_ttft_p50", "bystander_ttft_p50")
BUDGETS = (24, 36, 42, 48, 60)  # paired repeats a gate may stop at (budget_rows)
WORST = ("FAIL", "INCONCLUSIVE", "NOT JUDGED", "REFUSED", "PASS")


def read_decision(gate_dir: str | Path) -> dict | None:
    """A gate's verdicts from its decision.json (bench.rundir.decision): the whole verdict, each
    gated metric's worst verdict over its configurations, and `protocol metric_ms` ->
    `point [low, high], n=N`; None where the gate left no decision.json (an older gate, or
    one refused before judging)."""
    path = Path(gate_dir) / "ab" / decision.FILE
    if not gate_dir or not path.is_file():
        return None
    d = decision.read(path)
    states: dict[str, str] = {}
    for m in (m for m in d.metrics if m.metric in GATED):
        if WORST.index(m.verdict) < WORST.index(states.get(m.metric, "PASS")):
            states[m.metric] = m.verdict
        states.setdefault(m.metric, m.verdict)
    return {"verdict": d.verdict, "states": states,
            "intervals": {f"{m.protocol} {m.metric}_ms": f"{m.ratio:.3f} [{m.low:.3f}, "
                          f"{m.high:.3f}], n={m.pairs}" for m in d.metrics
                          if m.metric in GATED and m.low is not None}}


def verdict(r: dict) -> str:
    """A gate's whole verdict: its decision.json's; for an older gate (none), from the states
    it recorded, UNRESOLVED where one was (the rule before INCONCLUSIVE: it failed)."""
    d = read_decision(r.get("dir", ""))
    if d is not None:
        return d["verdict"]
    if r.get("verdict"):
        return r["verdict"]
    seen = set(r.get("states", {}).values())
    return next((s for s in ("FAIL", "UNRESOLVED", "INCONCLUSIVE") if s in seen), "PASS")


def table(results: list[dict]) -> list[str]:
    """Per label: gates, and how many ended FAIL, INCONCLUSIVE and PASS (decision.json's
    verdict; older gates' UNRESOLVED in a column of its own where there are any), with the
    median paired repeats and seconds."""
    seen = [verdict(r) for r in results]
    kinds = ["FAIL", "INCONCLUSIVE", *(["UNRESOLVED"] if "UNRESOLVED" in seen else []), "PASS"]
    rows = [f"| gates | n | {' | '.join(kinds)} | paired repeats (median) | seconds (median) |",
            "|---|---|" + "---|" * len(kinds) + "---|---|"]
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [(r, v) for r, v in zip(results, seen, strict=True) if r["label"] == label]
        rows.append(f"| {label} | {len(rs)} | "
                    + " | ".join(str(sum(v == k for _, v in rs)) for k in kinds) + " | "
                    f"{pd.Series([r['repeats'] for r, _ in rs]).median():g} | "
                    f"{pd.Series([r['seconds'] for r, _ in rs]).median():.0f} |")
    return rows


def cpu_lost(gate_dir: str) -> str:
    """How quiet the machine was for a gate: the share of each serve's CPU time lost to steal
    and to other processes (ranks.csv `cpu_lost`, every rank of every serve of both sides),
    its median and 90th percentile; "-" where the gate left no serves."""
    files = sorted(Path(gate_dir).glob("ab/stages/*/*/ranks.csv")) if gate_dir else []
    if not files:
        return "-"
    lost = pd.concat([pd.read_csv(f, usecols=["cpu_lost"]) for f in files])["cpu_lost"]
    return f"{lost.median():.1%} / {lost.quantile(0.9):.1%}"


def gate_rows(results: list[dict]) -> list[str]:
    """One row a gate, in the order run: its kind, exit, paired repeats, seconds, the CPU
    its serves lost to other work, and each protocol's step-time B/A with its 95 % interval."""
    protocols = sorted({k.split()[0] for r in results for k in r["intervals"]})
    rows = ["| # | gate | exit | pairs | s | cpu lost p50 / p90 | "
            + " | ".join(f"{p} step B/A [95% CI]" for p in protocols) + " |",
            "|---|---|---|---|---|---|" + "---|" * len(protocols)]
    for i, r in enumerate(results):
        steps = [r["intervals"].get(f"{p} step_mean_ms", "-").rsplit(", n=", 1)[0]
                 for p in protocols]
        rows.append(f"| {i} | {r['label']} | {r['exit']} | {r['repeats']} | {r['seconds']:.0f} "
                    f"| {cpu_lost(r.get('dir', ''))} | " + " | ".join(steps) + " |")
    return rows


def checks(results: list[dict]) -> dict[str, list[tuple[float, float, float, int]]]:
    """`protocol metric` -> (point, low, high, n) of each gate in `results`."""
    out: dict[str, list] = {}
    for r in results:
        for key, text in r["intervals"].items():
            point, rest = text.split(" [", 1)
            low, rest = rest.split(", ", 1)
            high, n = rest.split("], n=", 1)
            out.setdefault(key, []).append((float(point), float(low), float(high), int(n)))
    return out


def budget_rows(results: list[dict], thresholds: dict[str, float],
                budgets: tuple[int, ...] = BUDGETS) -> list[str]:
    """What budget the quiet A/As ask for. Per gated check: its pairs' spread (the median
    over the A/As of the sd behind each interval), its lean (the mean of the A/As' log
    points, with its 95 % interval over the gates), and the chance that a quiet A/A stopped
    at n pairs is left UNRESOLVED on it (bench.ab.sequential.left_unresolved), with no lean
    and with the lean measured; the last row, on any check (the checks taken as
    independent). Each n is headed with its A/B seconds at the quiet A/As' median seconds
    per pair. [] without quiet A/As."""
    from scipy import stats

    aa = checks([r for r in results if r["label"] == "A/A quiet"])
    if not aa:
        return []
    quiet = [r for r in results if r["label"] == "A/A quiet" and r.get("repeats")]
    per_pair = (float(pd.Series([r["seconds"] / r["repeats"] for r in quiet]).median())
                if quiet and all("seconds" in r for r in quiet) else None)
    rows = ["| check | threshold | pair sd (median) | B/A lean [95% CI] over the A/As | "
            + " | ".join(f"n={n}" + (f" (~{n * per_pair:.0f} s)" if per_pair else "")
                         + ": none / lean" for n in budgets) + " |",
            "|---|---|---|---|" + "---|" * len(budgets)]
    stay = {n: [1.0, 1.0] for n in budgets}  # per budget, P(every check resolves)
    for key, seen in sorted(aa.items()):
        threshold = thresholds[key.split()[1].removesuffix("_ms")]
        sd = float(pd.Series([sequential.spread(lo, hi, n) for _, lo, hi, n in seen]).median())
        logs = [math.log(p) for p, *_ in seen]
        lean = math.exp(sum(logs) / len(logs)) - 1
        ci = (stats.ttest_1samp(logs, 0).confidence_interval() if len(logs) > 1
              else None)
        cells = []
        for n in budgets:
            p0 = sequential.left_unresolved(sd, threshold, n)
            p1 = sequential.left_unresolved(sd, threshold, n, lean)
            stay[n][0] *= 1 - p0
            stay[n][1] *= 1 - p1
            cells.append(f"{p0:.2%} / {p1:.2%}")
        lean_text = f"{lean:+.2%}" + (f" [{math.exp(ci.low) - 1:+.2%}, "
                                      f"{math.exp(ci.high) - 1:+.2%}]" if ci else "")
        rows.append(f"| {key} | {threshold:.0%} | {sd:.1%} | {lean_text} | "
                    + " | ".join(cells) + " |")
    rows.append(f"| any check ({len(aa)}) | | | | "
                + " | ".join(f"{1 - stay[n][0]:.2%} / {1 - stay[n][1]:.2%}"
                             for n in budgets) + " |")
    return rows


def lines(results: list[dict], thresholds: dict[str, float]) -> list[str]:
    return table(results) + ["", *gate_rows(results), "", *budget_rows(results, thresholds)]
