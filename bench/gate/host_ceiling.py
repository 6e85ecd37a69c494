"""The host-work ceiling: no protocol's scheduler thread does more Python work per step or
per poll than the committed baseline's, beyond a tolerance (gate.json `host_work`).

The counts come from `bench run --host-work` (bench.run.host_profile: ranks.csv's host_*
columns, one row per rank and cell). They are counts of what the scheduler thread ran on a
pinned schedule, so the machine's load does not move them, but they are not exact: two
paths read what another thread did (a poll's short-circuit on whether the hit query has
landed; which thread first records a request's collective). Their A/A spread is the
tolerance's floor. As with the per-poll collective
ceiling, the figure held is each configuration's largest over its ranks and repeats.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.verdict.checks import Check, make_check
from bench.verdict.thresholds import within_ceiling

KEY = "host_work"  # gate.json's key
# metric -> (events column, divisor column) of ranks.csv
METRICS = {"events_per_step": ("host_events", "host_steps"),
           "poll_events_per_poll": ("host_poll_events", "host_polls")}
# A/A: events per step and per poll spread by at most 0.094 % over 6 loaded serves of
# pr27010 and pr36425, and rose at most 0.58 % above a ci run's ceilings in 3 more ci runs
# (best_effort's short serves); 2 % is over 3 times that, and one call more in pr36425's
# 22-event poll (+4.5 %) fails it. Work of 1 % of a step is +194 % per step there
# (docs/results/2026-12-06_host_work_e136a1c.md).
TOLERANCE = 0.02


def measured(ranks: pd.DataFrame | None) -> tuple[str | None, dict]:
    """The run's counting mode and, per (protocol, policy), each metric's largest value over
    ranks and repeats; (None, {}) when the run counted nothing."""
    if ranks is None or "host_work" not in ranks:
        return None, {}
    rows = ranks[ranks["host_work"].notna() & (ranks["host_work"].astype(str) != "")]
    if rows.empty:
        return None, {}
    if "host_same_schedule" in rows:  # a count of another schedule is no count of this one
        rows = rows.assign(host_events=rows["host_events"].where(
            rows["host_same_schedule"].astype(str) != "False"))
        rows = rows.assign(host_poll_events=rows["host_poll_events"].where(
            rows["host_events"].notna()))
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (protocol, policy), g in rows.groupby(["protocol", "policy"], sort=True):
        out[(str(protocol), str(policy))] = {m: _largest(g, num, den)
                                             for m, (num, den) in METRICS.items()}
    return str(rows["host_work"].iloc[0]), out


def _largest(g: pd.DataFrame, num: str, den: str) -> float:
    n, d = pd.to_numeric(g[num], errors="coerce"), pd.to_numeric(g[den], errors="coerce")
    ratio = (n / d.where(d > 0)).dropna()
    return float(ratio.max()) if len(ratio) else math.nan


def ceilings(ranks: pd.DataFrame | None, run_name: str,
             tolerance: float = TOLERANCE) -> dict | None:
    """gate.json's `host_work` from a run's ranks.csv (None: the run counted nothing)."""
    mode, by_config = measured(ranks)
    if mode is None:
        return None
    table: dict[str, dict] = {}
    for (protocol, policy), values in by_config.items():
        table.setdefault(protocol, {})[policy] = {
            m: (round(v, 3) if math.isfinite(v) else None) for m, v in values.items()}
    return {"mode": mode, "tolerance": tolerance, "source_run": run_name,
            "method": "per protocol and policy the largest over ranks of the counted "
                      "serve's Python events (bench.run.host_profile) per step and per poll",
            "ceilings": table}


def with_ceilings(settings: dict, ranks: pd.DataFrame | None, run_name: str) -> dict:
    """gate.json's settings with `host_work` from the run (kept as it was, with its
    tolerance, when the run counted nothing)."""
    old = settings.get(KEY) or {}
    new = ceilings(ranks, run_name, old.get("tolerance", TOLERANCE))
    return settings if new is None else {**settings, KEY: new}


def host_work_checks(summary: pd.DataFrame, ranks: pd.DataFrame | None,
                     settings: dict) -> list[Check]:
    """Per summary row and metric: the run's count <= the baseline's ceiling x (1 +
    tolerance). Nothing when gate.json holds no ceilings; not judged when the run counted
    nothing or in another mode."""
    held = settings.get(KEY)
    if not held:
        return []
    mode, got = measured(ranks)
    tol = float(held.get("tolerance", TOLERANCE))
    checks = []
    for row in summary.to_dict("records"):
        limits = held["ceilings"].get(str(row["protocol"]), {}).get(str(row["policy"]))
        if limits is None:  # no ceiling for this configuration
            continue
        if mode != held["mode"]:
            why = ("not judged: the run counted no host work (bench run --host-work)"
                   if mode is None else f"not judged: the run counted {mode}, the baseline "
                                        f"{held['mode']}")
            checks.append(make_check(row, "host_work", True, judged=False, note=why))
            continue
        values = got.get((str(row["protocol"]), str(row["policy"])), {})
        checks += [_check(row, m, values.get(m, math.nan), limits.get(m), tol, mode)
                   for m in METRICS]
    return checks


def _check(row: dict, metric: str, value: float, limit: float | None, tol: float,
           mode: str) -> Check:
    per = metric.split("_per_")[-1]
    name = f"host_work_{per}"
    if limit is None or not math.isfinite(value):
        return make_check(row, name, True, judged=False,
                          note=f"not judged: no {metric} in the run or the baseline (or "
                               "the counted serve ran another schedule)")
    ok = within_ceiling(value, limit, tol)
    return make_check(
        row, name, ok, expected=f"<= {limit:.1f} x {1 + tol:g}", observed=f"{value:.1f}",
        meaning="" if ok else f"{row['protocol']}'s scheduler thread runs {value / limit - 1:.1%} "
                              f"more Python {mode} per {per} than the committed baseline: "
                              "host work was added to its step or poll path; if meant, record "
                              "the baseline again")
