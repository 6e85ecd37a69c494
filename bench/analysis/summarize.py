"""requests.csv + steps.csv -> summary rows (SUMMARY_COLUMNS) and the human table.

One summary row per configuration group (GROUP_KEYS): a protocol x policy cell of the matrix
for one layout, storage, rate and extra-pool setting, pooled over repeats; its ratios to
pr27010 come with between-repeat intervals (bench.stats). Collective counts are rank 0's
(see hicache.spec.cost_model); expectations come from the same analytic model, so a row whose
measured and expected columns differ has a protocol or counting bug.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.analysis import estimate
from bench.analysis.estimate import PerRepeat
from bench.analysis.serving_metrics import (
    interval_method,
    interval_note,
    overhead_columns,
    ratio_columns,
    reference_protocol,
    serving_columns,
)
from bench.report.printer import fitted_table, interval_text
from bench.rundir.files import as_bool, clean_key, column_by_repeat, is_true, list_cell
from bench.rundir.schema import (
    GROUP_KEYS,
    REFERENCE_PROTOCOL,
    STEP_SITES,
    SUMMARY_COLUMNS,
    TIER_COLUMNS,
)
from bench.stats import (
    PERCENTILE_METHODS,
    Interval,
    per_repeat_ratios,
    per_repeat_stat,
    percentile,
)
from bench.verdict.run_rules import data_errors, rejected, served, unexplained_disagreements
from hicache.spec.cost_model import POLICIES, PROTOCOLS, Setting, expected_per_request


def config_groups(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """Clean GROUP_KEYS key -> rows, in order of first appearance."""
    if df.empty:
        return {}
    return {clean_key(k): g for k, g in df.groupby(GROUP_KEYS, dropna=False, sort=False)}


def background_collectives(requests: pd.DataFrame) -> pd.Series:
    """Per request, measured: hit query + acks + the PP-ticket broadcast (a column runs
    before sglang-0.5.23 do not carry: 0 there)."""
    ticket = (requests["ticket_collectives"].fillna(0) if "ticket_collectives" in requests
              else 0)
    return requests["hit_query_collectives"] + requests["ack_collectives"] + ticket


def expected_counts(requests: pd.DataFrame) -> pd.DataFrame:
    """Per request: the cost model's decision and background (hit query + ack + ticket)
    collectives."""
    hit_pages = (requests["hit_tokens"].fillna(0) // requests["page_size"]).astype(int)
    extra = (as_bool(requests["extra_pool"]) if "extra_pool" in requests
             else pd.Series(False, index=requests.index))
    # runs before host_memory (no column, or empty cells) are "cache"
    host = [h if isinstance(h, str) else "cache"
            for h in requests.get("host_memory", pd.Series(index=requests.index))]
    # pr38284's polls of a request this rank holds no prefetch of (runs before the column:
    # none)
    absent = requests["absent_polls"].fillna(0) if "absent_polls" in requests \
        else pd.Series(0, index=requests.index)
    # PrefetchOperations a request issued (0.5.23's retries: more than one); runs before
    # the column: one where an op was issued
    ops = requests["prefetch_ops"] if "prefetch_ops" in requests \
        else pd.Series(None, index=requests.index)
    rows = zip(requests["protocol"], requests["policy"], requests["tp"], requests["pp"],
               requests["polls"], hit_pages, as_bool(requests["op_issued"]),
               as_bool(requests["io_issued"]), requests["terminated_by"] == "poll", extra,
               host, absent, ops, strict=True)
    decision, background = [], []
    for proto, policy, tp, pp, polls, pages, op, io, by_poll, side, mem, gone, n in rows:
        e = expected_per_request(Setting(proto, policy, int(tp), int(pp), host_memory=str(mem),
                                         extra_pool=bool(side)),
                                 int(polls), int(pages), bool(op), bool(io), bool(by_poll),
                                 absent_polls=int(gone), ops=None if pd.isna(n) else int(n))
        decision.append(e.decision)
        background.append(e.hit_query + e.ack + e.ticket)
    return pd.DataFrame({"decision": decision, "background": background}, index=requests.index)


def _by_repeat(g: pd.DataFrame, column: str) -> dict[int, np.ndarray]:
    """Repeat -> non-missing values of `column`."""
    return column_by_repeat(g, column)


def _count_columns(g: pd.DataFrame) -> dict:
    """Per-request collective counts, measured and expected."""
    exp = expected_counts(g)
    polls = g["polls"].sum()
    return {
        "polls_per_req": g["polls"].mean(),
        "decision_collectives_per_req": g["decision_collectives"].mean(),
        "decision_collectives_per_poll":
            g["decision_collectives"].sum() / polls if polls > 0 else math.nan,
        "expected_decision_collectives_per_req": exp["decision"].mean(),
        "critical_collectives_per_req": (g["decision_collectives"]
                                         + g["completion_collectives"] + g["pp_hops"]).mean(),
        "background_collectives_per_req": background_collectives(g).mean(),
        "expected_background_collectives_per_req": exp["background"].mean(),
    }


def _step_columns(steps: pd.DataFrame | None, n_requests: int) -> dict:
    """Per-step collectives (broadcast, per-step MIN, model), per step and per request."""
    if steps is None or steps.empty:
        return {"step_collectives_per_step": math.nan, "step_collectives_per_req": math.nan,
                "sync_ms_per_step": math.nan}
    per_step = steps[STEP_SITES].sum(axis=1)
    return {
        "step_collectives_per_step": per_step.mean(),
        "step_collectives_per_req": per_step.sum() / n_requests if n_requests else math.nan,
        "sync_ms_per_step": steps["sync_ms"].mean(),
    }


def _ttft_columns(g: pd.DataFrame, method: str) -> dict:
    """TTFT percentiles (pooled over repeats), the median scheduler lag, and its p50, p95
    and p99 over the prefetching requests whose prefetch was issued."""
    ttft = g["ttft_ms"].dropna().to_numpy(float)

    def pct(values: np.ndarray, q: float) -> float:
        v = percentile(values, q, method)
        return math.nan if v is None else v
    # IO done -> scheduled, the lag SGLang #32724 names, for the class that prefetches (a
    # bystander has nothing to fetch: no lag to speak of).
    prefetching = g if "request_class" not in g else g[g["request_class"] != "bystander"]
    lag = prefetching.loc[as_bool(prefetching["op_issued"]), "sched_lag_ms"] \
        if "op_issued" in prefetching else prefetching["sched_lag_ms"]
    lag = lag.dropna().to_numpy(float)
    return {
        **{f"prefetch_sched_lag_p{q}_ms": pct(lag, q) for q in (50, 95, 99)},
        "sched_lag_p50_ms": pct(g["sched_lag_ms"].dropna().to_numpy(float), 50),
        "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90),
        "ttft_p99_ms": pct(ttft, 99), "ttft_mean_ms": ttft.mean() if ttft.size else math.nan,
    }


def _ratio_columns(g: pd.DataFrame, ref: pd.DataFrame | None,
                   lost: tuple[PerRepeat, PerRepeat]) -> tuple[dict, list[Interval]]:
    """TTFT p50 ratio vs the reference protocol's group: per repeat the median TTFT of each
    side, paired by repeat, its interval (as every ratio's: bench.analysis.estimate.served)
    and the per-repeat ratios."""
    x = per_repeat_stat(_by_repeat(g, "ttft_ms"), "p50")
    y = per_repeat_stat(_by_repeat(ref, "ttft_ms"), "p50") if ref is not None else {}
    iv = estimate.served(x, y, *lost)
    return {"ttft_p50_ratio_vs_pr27010": math.nan if iv.point is None else iv.point,
            "ttft_p50_ratio_ci_low": math.nan if iv.low is None else iv.low,
            "ttft_p50_ratio_ci_high": math.nan if iv.high is None else iv.high,
            "ttft_p50_ratio_mdd": math.nan if iv.half_width is None else iv.half_width,
            "ttft_p50_ratio_repeats": iv.n,
            "ttft_p50_ratio_per_repeat": list_cell(per_repeat_ratios(x, y).values())
            or math.nan}, [iv]


def tier_columns(g: pd.DataFrame) -> dict:
    """Each source's share of all prompt tokens (requests.csv's token columns), and the
    trace's own bound on the reused share; unknown (runs before these columns) is NaN."""
    if "prompt_tokens" not in g or not g["prompt_tokens"].sum() > 0:
        return dict.fromkeys(TIER_COLUMNS, math.nan)
    total = g["prompt_tokens"].sum()
    out = {f"{k}_ratio": g[f"{k}_tokens"].sum() / total
           for k in ("device_hit", "host_hit", "storage_hit", "computed")}
    bound = pd.to_numeric(g["reuse_bound_tokens"], errors="coerce") \
        if "reuse_bound_tokens" in g else pd.Series([math.nan])
    out["reuse_bound_ratio"] = bound.sum() / total if bound.notna().all() else math.nan
    return out


def _config_columns(key: tuple, g: pd.DataFrame) -> dict:
    """Group key plus the layout columns that are constant within a group."""
    cells = dict(zip(GROUP_KEYS, key, strict=True))
    for col in ("world_size", "device", "backend", "model", "forward"):
        cells[col] = g[col].iloc[0] if col in g else None
    host = g["host_memory"].iloc[0] if "host_memory" in g else None
    cells["host_memory"] = host if isinstance(host, str) else "cache"  # runs before it
    schedule = g["schedule"].iloc[0] if "schedule" in g else None
    cells["schedule"] = schedule if isinstance(schedule, str) else "free"  # runs before it
    # The serve's schedule digest per repeat, in repeat order (equal where pinned alike).
    cells["schedule_digest"] = " ".join(
        str(x["schedule_digest"].iloc[0]) for _, x in g.groupby("repeat")) \
        if "schedule_digest" in g else None
    repeats = g["repeat"].nunique()
    cells["repeats"] = repeats
    cells["requests"] = int(round(len(g) / repeats)) if repeats else 0
    cells["rejected_requests"] = int(rejected(g).sum())  # all repeats
    return cells


def _check_columns(g: pd.DataFrame, method: str) -> dict:
    """Correctness columns: every row's ranks agreed, how many disagreements were a known
    hazard, and how many rows had bad data."""
    bad = as_bool(g["ranks_agree"]) != True  # noqa: E712
    return {"ranks_agree": bool((as_bool(g["ranks_agree"]) == True).all()),  # noqa: E712
            "known_disagreements": int((bad & ~unexplained_disagreements(g)).sum()),
            "unexplained_disagreements": int(unexplained_disagreements(g).sum()),
            "data_errors": int(data_errors(g).sum()),
            "percentile_method": method}


def _order(row: dict) -> tuple:
    """Sort key: protocols and policies in cost_model order, then layout and rate."""
    def index(seq: tuple, v: object) -> int:
        return seq.index(v) if v in seq else len(seq)
    rate = row["rate_rps"]
    return (index(PROTOCOLS, row["protocol"]), str(row["protocol"]),
            index(POLICIES, row["policy"]), str(row["policy"]), row["tp"], row["pp"],
            str(row["storage"]), rate is None, rate or 0.0,
            str(row["extra_pool"]), str(row["race_guard"]))


def cores_busy(ranks: pd.DataFrame | None) -> dict[tuple, float]:
    """Per group: CPU cores the run's ranks kept busy while serving (all ranks' CPU seconds
    over rank 0's wall seconds, averaged over repeats)."""
    if ranks is None or ranks.empty or "cpu_s" not in ranks:
        return {}
    out = {}
    for key, g in config_groups(ranks).items():
        per_repeat = [x["cpu_s"].sum() / x.loc[x["rank"] == 0, "wall_s"].sum()
                      for _, x in g.groupby("repeat") if x.loc[x["rank"] == 0, "wall_s"].sum()]
        out[key] = float(np.mean(per_repeat)) if per_repeat else math.nan
    return out


def summarize(
    requests: pd.DataFrame, steps: pd.DataFrame, percentile_method: str = "linear",
    calibration: dict | None = None, ranks: pd.DataFrame | None = None,
    reference: str = REFERENCE_PROTOCOL,
) -> pd.DataFrame:
    """One SUMMARY_COLUMNS row per configuration group of `requests` (see module docstring);
    `calibration` (calibration.json) feeds the overhead model, `ranks` the CPU load;
    `reference` the protocol every ratio is taken against (a run of several SGLangs: its
    first side)."""
    if percentile_method not in PERCENTILE_METHODS:
        raise ValueError(f"unknown percentile method {percentile_method!r}")
    groups, step_groups = config_groups(requests), config_groups(steps)
    refs = {k[1:]: k for k in groups if k[0] == reference}
    busy = cores_busy(ranks)
    lost = {k: estimate.lost_by_repeat(r) for k, r in config_groups(ranks).items()} \
        if ranks is not None and "cpu_lost" in ranks else {}
    rows = {}
    for key, whole in groups.items():
        g = served(whole)  # the refused requests have no timings, tokens or collectives
        s, ref = step_groups.get(key), refs.get(key[1:])
        pair = (lost.get(key, {}), lost.get(ref, {}))
        ttft, ttft_iv = _ratio_columns(g, groups.get(ref), pair)
        serving, serving_iv = ratio_columns(g, s, groups.get(ref), step_groups.get(ref), pair)
        rows[key] = (_config_columns(key, whole) | _count_columns(g) | _step_columns(s, len(g))
                     | _ttft_columns(g, percentile_method) | tier_columns(g) | ttft
                     | serving_columns(g, s, busy.get(key)) | serving
                     | _check_columns(whole, percentile_method)
                     | {"interval_note": interval_note(ttft_iv + serving_iv),
                        "interval_method": interval_method(ttft_iv + serving_iv)})
    for key, row in rows.items():
        name = reference_protocol({k[0] for k in groups if k[1:] == key[1:]}, key[1])
        ref = (name, *key[1:])
        row |= overhead_columns(row, step_groups.get(key), rows.get(ref), step_groups.get(ref),
                              calibration)
    out = sorted(rows.values(), key=_order)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


TABLE_HEADERS = ["protocol", "policy", "tp", "pp", "polls/req", "decision/req", "expected",
                 "critical/req", "background/req", "step/step", "p50_ms", "p90_ms", "p99_ms",
                 "ratio [95% ci]", "agree", "data_err"]
# Configuration columns shown after `pp` only when they differ between rows (e.g. a rate sweep).
VARYING_COLUMNS = ["storage", "rate_rps", "extra_pool", "race_guard"]


def _num(v: object, fmt: str = ".3f") -> str:
    """A number cell; unknown (None/NaN) is '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def varying_columns(summary: pd.DataFrame) -> list[str]:
    """The VARYING_COLUMNS whose values differ between summary rows."""
    return [c for c in VARYING_COLUMNS
            if c in summary and summary[c].astype(str).nunique() > 1]


def table_headers(summary: pd.DataFrame) -> list[str]:
    """TABLE_HEADERS with the varying configuration columns inserted after `pp`."""
    return TABLE_HEADERS[:4] + varying_columns(summary) + TABLE_HEADERS[4:]


def _ratio_cell(r: dict) -> str:
    """'point [low, high]', 'point [no CI]', or '-' when there is no reference group."""
    return interval_text(r["ttft_p50_ratio_vs_pr27010"], r["ttft_p50_ratio_ci_low"],
                         r["ttft_p50_ratio_ci_high"], ".3f")


def _agree_cell(r: dict) -> str:
    """yes; "stages" when only pre27010's known PP-stage hazard disagreed; else NO."""
    if is_true(r["ranks_agree"]):
        return "yes"
    return "stages" if r.get("unexplained_disagreements") == 0 else "NO"


def table_rows(summary: pd.DataFrame) -> list[list[str]]:
    """The human table's cells (table_headers(summary)), one list per summary row."""
    extra = varying_columns(summary)
    out = []
    for r in summary.to_dict("records"):
        out.append([str(r["protocol"]), str(r["policy"]), str(r["tp"]), str(r["pp"])]
                   + [_num(r[c], "g") if isinstance(r[c], float) else str(r[c]) for c in extra]
                   + [_num(r["polls_per_req"]), _num(r["decision_collectives_per_req"]),
                      _num(r["expected_decision_collectives_per_req"]),
                      _num(r["critical_collectives_per_req"]),
                      _num(r["background_collectives_per_req"]),
                      _num(r["step_collectives_per_step"]), _num(r["ttft_p50_ms"], ".1f"),
                      _num(r["ttft_p90_ms"], ".1f"), _num(r["ttft_p99_ms"], ".1f"),
                      _ratio_cell(r), _agree_cell(r),
                      str(r["data_errors"])])
    return out


def format_table(summary: pd.DataFrame) -> str:
    """A compact fixed-width table of the summary rows, for a terminal: no wider than one
    (bench.report.printer.WIDTH), its columns stacked in groups led by protocol and policy when
    they do not fit."""
    headers = table_headers(summary)
    right = frozenset(range(2, len(headers)))
    return "\n".join(fitted_table(headers, table_rows(summary), keys=2, right=right))
