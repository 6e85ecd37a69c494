"""The report's lead (docs/design.md section 8): what the overhead model expects, the
headline table (each protocol against pr27010 in the same configuration), and the model's
prediction next to the measurement, each closed by one sentence.

All text is built from summary rows (bench.analysis.summarize), so it can be rebuilt from the CSVs.
"""

from __future__ import annotations

import math
import textwrap

import pandas as pd

from bench.analysis.estimate import DISTURBED_METHOD
from bench.report.printer import fitted_table, interval_text, wrapped
from bench.rundir.schema import DISTURBED_LIMIT, REFERENCE_PROTOCOL
from hicache.spec.cost_model import OPEN_PRS, POLICIES, PROTOCOLS

HEADLINE_PROTOCOLS = ("pr27010", "pr36425", "step-clock", "sglang-0.5.23")  # those run
HEADLINE_POLICIES = ("wait_complete", "timeout")
# The headline (free schedule): what a server sees, end to end. TTFT per class first.
HEADLINE_HEADERS = ["protocol", "policy", "polls/step", "step ms", "step x",
                    "TTFT p50 x prefetch", "TTFT p50 x bystander", "ITL p50 x", "e2e p50 x",
                    "TTFT p99 x prefetch", "TTFT p99 x bystander", "ITL p99 x"]
RATIO_COLUMNS = ["step_mean", "prefetch_ttft_p50", "bystander_ttft_p50", "itl_p50", "e2e_p50",
                 "prefetch_ttft_p99", "bystander_ttft_p99", "itl_p99"]
# The cost decomposition (a pinned schedule, or the free run's own collectives): host time,
# never a TTFT or ITL effect (docs/metrics.md, "The headline and the cost decomposition").
COST_HEADERS = ["protocol", "policy", "coll/req", "polls/step", "coll/step",
                "decision ms/step", "ms/poll", "model ms/step", "step ms", "step x"]
COST_RATIOS = ["step_mean"]
LABELS = {"step_mean": "step", "itl_p50": "ITL p50", "itl_p99": "ITL p99",
          "prefetch_ttft_p50": "TTFT p50 prefetch", "bystander_ttft_p50": "TTFT p50 bystander",
          "prefetch_ttft_p99": "TTFT p99 prefetch", "bystander_ttft_p99": "TTFT p99 bystander",
          "e2e_p50": "e2e p50"}
# `bench run --resolve`'s ratios (make bench's): the headline's p50s and the step
RESOLVED = ("step_mean", "prefetch_ttft_p50", "bystander_ttft_p50", "itl_p50")
HEADLINE_TITLE = "Headline, end to end, ratios to pr27010"
COST_TITLE = "Cost decomposition, ratios to pr27010"
MODEL_HEADERS = ["protocol", "policy", "polls/step", "c calib ms", "c in run ms",
                 "predicted extra ms/step", "measured extra ms/step", "ITL x predicted",
                 "ITL x measured", "agree"]


def _f(v: object, fmt: str = ".2f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def _ratio(row: dict, name: str) -> str:
    if row["protocol"] == REFERENCE_PROTOCOL and not pd.isna(row.get(f"{name}_ratio")):
        return "1 (ref)"  # itself, repeat by repeat: exactly 1, no interval to give
    return interval_text(row.get(f"{name}_ratio"), row.get(f"{name}_ratio_ci_low"),
                         row.get(f"{name}_ratio_ci_high"))


def resolution_lines(summary: pd.DataFrame) -> list[str]:
    """What the run can resolve: per ratio the table shows (the headline's on a free
    schedule, step time alone on a pinned one), the largest half-width (as a fraction) of its
    95% interval over the non-reference headline rows; or, once, why there are no
    intervals."""
    rows = _compared(summary)
    notes = [r.get("interval_note") for r in rows if isinstance(r.get("interval_note"), str)
             and r.get("interval_note")]
    names = RATIO_COLUMNS if is_end_to_end(summary) else COST_RATIOS
    widths = {name: [r[f"{name}_ratio_mdd"] for r in rows
                     if not pd.isna(r.get(f"{name}_ratio_mdd", math.nan))]
              for name in names}
    parts = [f"{LABELS[n]} {100 * max(w):.1f}%" for n, w in widths.items() if w]
    if not parts:
        return [f"No intervals: {notes[0]}." if notes else "No intervals."]
    repeats = [int(r["step_mean_ratio_repeats"]) for r in rows
               if not pd.isna(r.get("step_mean_ratio_repeats", math.nan))]
    text = (f"Resolvable differences (the largest 95% half-width over these rows, "
            f"{min(repeats) if repeats else '?'} paired repeats each): " + ", ".join(parts)
            + "; a smaller difference is not resolved by this run." + _adjusted(rows))
    return [text] + ([f"Note: {notes[0]}."] if notes else [])


def _adjusted(rows: list[dict]) -> str:
    """Which rows' intervals are cpu-adjusted (bench.analysis.estimate.method_for: more than
    a tenth of their serves lost over DISTURBED_LIMIT of the machine's CPU)."""
    methods = [str(r.get("interval_method") or "") for r in rows]
    adjusted = sum(m.startswith(DISTURBED_METHOD) for m in methods)
    if not adjusted:
        return ""
    return (f" Intervals cpu-adjusted in {adjusted} of {len(rows)} rows: more than a tenth "
            f"of their serves lost over {DISTURBED_LIMIT:.0%} of the machine's CPU.")


def _compared(summary: pd.DataFrame) -> list[dict]:
    """The headline's rows that are ratios to another protocol (not the reference's)."""
    return [r for r in _pick(summary, HEADLINE_PROTOCOLS, HEADLINE_POLICIES)
            if r["protocol"] != REFERENCE_PROTOCOL]


def half_widths(summary: pd.DataFrame, names: tuple[str, ...] = RESOLVED
                ) -> dict[str, float | None]:
    """Per headline row and ratio (`protocol/policy metric`) its interval's half-width as a
    fraction, None where the row has no interval yet: what `bench run --resolve` stages
    toward."""
    return {f"{r['protocol']}/{r['policy']} {LABELS[n]}":
            None if pd.isna(r.get(f"{n}_ratio_mdd", math.nan)) else float(r[f"{n}_ratio_mdd"])
            for r in _compared(summary) for n in names}


def is_end_to_end(summary: pd.DataFrame) -> bool:
    """Whether the run's headline rows ran on the free schedule: only then are its TTFT and
    ITL ratios what a server sees (docs/design.md, Pinned schedules)."""
    rows = _pick(summary, HEADLINE_PROTOCOLS, HEADLINE_POLICIES)
    return bool(rows) and all(r.get("schedule", "free") in ("free", None) or
                              pd.isna(r.get("schedule")) for r in rows)


def _pick(summary: pd.DataFrame, protocols: tuple, policies: tuple) -> list[dict]:
    """Rows of `summary` for the protocols and policies present, in cost_model order."""
    sub = summary[summary["protocol"].isin(protocols) & summary["policy"].isin(policies)]
    rows = sub.to_dict("records")
    return sorted(rows, key=lambda r: (POLICIES.index(r["policy"]),
                                       PROTOCOLS.index(r["protocol"])))


def headline_rows(summary: pd.DataFrame) -> list[list[str]]:
    """The end-to-end headline's cells (HEADLINE_HEADERS); ratios are over pr27010's. Empty
    for a pinned run: its TTFT and ITL are not a server's (cost_rows instead)."""
    if not is_end_to_end(summary):
        return []
    return [[r["protocol"], r["policy"], _f(r["polls_per_step"], ".1f"),
             _f(r["step_mean_ms"], ".1f"), *[_ratio(r, name) for name in RATIO_COLUMNS]]
            for r in _pick(summary, HEADLINE_PROTOCOLS, HEADLINE_POLICIES)]


def cost_rows(summary: pd.DataFrame) -> list[list[str]]:
    """The cost decomposition's cells (COST_HEADERS): collectives, the scheduler's measured
    time in decision collectives per step and per poll, the model's polls x c, and (pinned)
    the step-time ratio, which on one schedule is host cost alone."""
    out = []
    for r in _pick(summary, PROTOCOLS, POLICIES):
        polls, sync = r.get("polls_per_step", math.nan), r.get("decision_sync_ms_per_step")
        per_poll = sync / polls if polls > 0 else math.nan  # NaN polls: not > 0
        out.append([r["protocol"], r["policy"], _f(r["critical_collectives_per_req"]),
                    _f(polls, ".1f"), _f(r["critical_collectives_per_step"]), _f(sync),
                    _f(per_poll, ".3f"), _f(r.get("predicted_extra_step_ms")),
                    _f(r["step_mean_ms"], ".1f"), _ratio(r, "step_mean")])
    return out


def model_rows(summary: pd.DataFrame) -> list[list[str]]:
    """Predicted beside measured extra step time, for every row with a reference."""
    out = []
    for r in _pick(summary, PROTOCOLS, POLICIES):
        if r.get("overhead_reference") in (None, "") or pd.isna(r["overhead_reference"]):
            continue
        agree = r["overhead_model_agrees"]
        out.append([r["protocol"], r["policy"], _f(r["polls_per_step"], ".1f"),
                    _f(r["c_ms"], ".3f"), _f(r["c_insitu_ms"], ".3f"),
                    f"{_f(r['predicted_extra_step_ms'])} [{_f(r['predicted_extra_step_low_ms'])}"
                    f", {_f(r['predicted_extra_step_high_ms'])}]",
                    interval_text(r["measured_extra_step_ms"],
                                  r["measured_extra_step_ci_low_ms"],
                                  r["measured_extra_step_ci_high_ms"]),
                    _f(r["predicted_itl_inflation"]), _f(r["measured_itl_inflation"]),
                    "-" if agree is None or pd.isna(agree) else ("yes" if _true(agree)
                                                                 else "NO")])
    return out


def _true(v: object) -> bool:
    return v in (True, "True", "true", 1)


def expected_step_ratio(summary: pd.DataFrame, protocol: str, policy: str
                        ) -> tuple[float, float, float] | None:
    """The model's step-time ratio of `protocol` over pr27010 under `policy`: (S + E_p) /
    (S + E_pr27010), S the reference protocol's mean step, E the predicted extras; the band
    takes each side's low and high prediction."""
    rows = {r["protocol"]: r for r in summary[summary["policy"] == policy].to_dict("records")}
    this, base = rows.get(protocol), rows.get(REFERENCE_PROTOCOL)
    if this is None or base is None or pd.isna(this.get("overhead_reference")):
        return None
    ref = rows.get(this["overhead_reference"])
    if ref is None or pd.isna(ref["step_mean_ms"]):
        return None
    s = ref["step_mean_ms"]

    def ratio(lo: str, hi: str) -> float:
        return (s + this[lo]) / (s + base[hi])
    return (ratio("predicted_extra_step_ms", "predicted_extra_step_ms"),
            ratio("predicted_extra_step_low_ms", "predicted_extra_step_high_ms"),
            ratio("predicted_extra_step_high_ms", "predicted_extra_step_low_ms"))


def expectation_lines(summary: pd.DataFrame, calib: dict | None) -> list[str]:
    """What the model expects from c and the polls, said before any measurement."""
    if calib is None:
        return ["No calibration.json: the run measured no c, so the model expects nothing."]
    if not calib.get("n"):
        return [f"No c at TP{calib['tp']}: no TP group to all-reduce on, so the model "
                "expects no decision-collective time."]
    c = calib["allreduce"]
    lines = ["The model predicts the scheduler's time per step in decision collectives "
             "(polls per step x c) and, from it, the step-time ratio at the polls per step "
             "measured; it predicts no TTFT.",
             f"One control-plane all-reduce (TP{calib['tp']}, gloo, n={calib['n']}) took "
             f"{c['mean_ms']:.3f} ms on average (p50 {c['p50_ms']:.3f}, p99 "
             f"{c['p99_ms']:.3f}, mean 95% CI [{c['mean_ci_low_ms']:.3f}, "
             f"{c['mean_ci_high_ms']:.3f}]) before the cells ran."]
    for policy in HEADLINE_POLICIES:
        band = expected_step_ratio(summary, "pr36425", policy)
        rows = summary[(summary["protocol"] == REFERENCE_PROTOCOL)
                       & (summary["policy"] == policy)].to_dict("records")
        if band is None or not rows:
            continue
        r = rows[0]
        lines.append(f"- {policy}: pr27010 polls {r['polls_per_step']:.1f} waiting requests "
                     f"per step at one all-reduce each, so the model expects "
                     f"+{r['predicted_extra_step_ms']:.1f} ms per step "
                     f"[{r['predicted_extra_step_low_ms']:.1f}, "
                     f"{r['predicted_extra_step_high_ms']:.1f}] and pr36425's step time at "
                     f"{band[0]:.2f}x pr27010's [{band[1]:.2f}, {band[2]:.2f}].")
    return lines


def band_lines(summary: pd.DataFrame) -> list[str]:
    """Per headline policy: the measured step ratio of pr36425 against the expected band."""
    lines = []
    for policy in HEADLINE_POLICIES:
        band = expected_step_ratio(summary, "pr36425", policy)
        rows = summary[(summary["protocol"] == "pr36425")
                       & (summary["policy"] == policy)].to_dict("records")
        if band is None or not rows or pd.isna(rows[0]["step_mean_ratio"]):
            continue
        r = rows[0]
        low, high = r["step_mean_ratio_ci_low"], r["step_mean_ratio_ci_high"]
        head = f"- {policy}: pr36425's step time is {r['step_mean_ratio']:.2f}x pr27010's"
        if pd.isna(low) or pd.isna(high):
            lines.append(f"{head} (no interval, see above).")
            continue
        excludes_one = high < 1 or low > 1
        inside = low <= band[2] and high >= band[1]
        lines.append(
            f"{head} [{low:.2f}, {high:.2f}]: "
            + ("the interval excludes 1" if excludes_one else "the interval includes 1")
            + ("; within the band the model expected" if inside
               else f"; outside the expected band [{band[1]:.2f}, {band[2]:.2f}]") + ".")
    return lines


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A terminal's table: whole when it fits, else in stacked column groups led by
    protocol and policy (bench.report.printer.fitted_table)."""
    return fitted_table(headers, rows)


# The terminal's headline in two tables, each under 120 characters (the report has it whole):
# the medians first, then polls per step, e2e and the tails.
HEADLINE_SPLIT = ([0, 1, 3, 4, 5, 6, 7], [0, 1, 2, 8, 9, 10, 11])
WIDTH = 118


def _wrapped(lines: list[str], width: int = WIDTH) -> list[str]:
    """The headline's prose at the tables' width: a terminal shows it without wrapping."""
    return [part for line in lines
            for part in textwrap.wrap(line, width, subsequent_indent="  ",
                                      break_on_hyphens=False) or [""]]


def _split_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out: list[str] = []
    for part in HEADLINE_SPLIT:
        out += _table([headers[i] for i in part], [[r[i] for i in part] for r in rows])
    return out


def lead_text(summary: pd.DataFrame, calib: dict | None) -> list[str]:
    """The terminal's lead after the table: expectation, the end-to-end headline (free
    schedule) or, for a pinned run, the cost decomposition in its place; verdicts, model."""
    if not _pick(summary, HEADLINE_PROTOCOLS, HEADLINE_POLICIES):
        return []  # nothing to hold against pr27010 (e.g. pre27010 alone)
    head, cost = headline_rows(summary), cost_rows(summary)
    out = ["", "Expected (overhead model):", *expectation_lines(summary, calib), ""]
    if head:
        out += [*_wrapped([f"{HEADLINE_TITLE} [95% CI over repeats], "
                           f"{schedule_label(summary)}:"]),
                *_split_table(HEADLINE_HEADERS, head),
                *_wrapped([*resolution_lines(summary), *lag_lines(summary)]), "",
                "Cost decomposition (the scheduler's time in decision collectives, measured "
                "in this run; model: polls/step x c):",
                *_table(COST_HEADERS[:-2], [r[:-2] for r in cost])]
    else:
        out += [f"{COST_TITLE} [95% CI over repeats], {schedule_label(summary)}:",
                *_table(COST_HEADERS, cost), *resolution_lines(summary),
                "Not a headline: TTFT and ITL on a pinned schedule are not what a server sees "
                "(`--schedule free`, make bench's default, measures them)."]
    return wrapped([*out, "", *band_lines(summary), agreement_sentence(summary),
                    tolerance_sentence(summary)])


def schedule_label(summary: pd.DataFrame) -> str:
    """Which schedule the figures come from (docs/design.md, Pinned schedules)."""
    kinds = set(summary["schedule"].dropna()) if "schedule" in summary else set()
    if kinds == {"pinned"}:
        return ("pinned schedule (each difference is the protocol's host cost on one "
                "schedule, not a TTFT or ITL effect)")
    if kinds <= {"free"}:
        return ("free schedule (what a server sees: the cost plus its feedback through the "
                "schedule)")
    return "mixed schedules (pinned and free rows)"


def lag_lines(summary: pd.DataFrame) -> list[str]:
    """IO done -> scheduled (SGLang #32724's io_done_to_scheduler_ready) of the prefetching
    requests, p50 / p95 / p99 ms, one line per policy of the headline rows."""
    rows = _pick(summary, HEADLINE_PROTOCOLS + OPEN_PRS, HEADLINE_POLICIES)
    if not rows or "prefetch_sched_lag_p99_ms" not in summary:
        return []
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        cells = [f"{r['protocol']} " + "/".join(_f(r[f"prefetch_sched_lag_p{q}_ms"], ".0f")
                                                for q in (50, 95, 99))
                 for r in rows if r["policy"] == policy]
        out.append(f"Scheduler lag, IO done -> scheduled, prefetching p50/p95/p99 ms "
                   f"({policy}): " + ", ".join(cells))
    return out


def agreement_sentence(summary: pd.DataFrame) -> str:
    """One sentence: for how many rows prediction and measurement agree, and why not."""
    rows = [r for r in summary.to_dict("records")
            if r.get("overhead_model_agrees") is not None
            and not pd.isna(r["overhead_model_agrees"])]
    if not rows:
        why = {r.get("overhead_model_note") for r in summary.to_dict("records")
               if not pd.isna(r.get("measured_extra_step_ms", math.nan))}
        why.discard(None)
        return ("No row has both a prediction and a measured interval to compare"
                + (f" ({sorted(why)[0]})." if why else "."))
    bad = [r for r in rows if not _true(r["overhead_model_agrees"])]
    text = (f"Prediction and measurement agree (their intervals overlap) for "
            f"{len(rows) - len(bad)} of {len(rows)} rows.")
    for r in bad[:4]:
        text += f" {r['protocol']}/{r['policy']}: {r['overhead_model_note']}."
    return text


TOLERANCE = 0.25  # the overhead model, held to it where its prediction is large enough
MIN_PREDICTED_MS = 0.5


def tolerance_sentence(summary: pd.DataFrame) -> str:
    """In how many rows predicting more than 0.5 ms the measured extra step time is within
    25 % of polls per step x c (the overhead model): c as calibrated before the cells, and
    c as the run's own decision collectives took (`c_insitu_ms`: a loaded machine slows
    them)."""
    rows = [r for r in summary.to_dict("records")
            if r.get("predicted_extra_step_ms", 0) > MIN_PREDICTED_MS
            and not pd.isna(r.get("measured_extra_step_ms", math.nan))]
    if not rows:
        return f"No row predicts more than {MIN_PREDICTED_MS} ms extra per step."

    def off(r: dict, scale: float) -> bool:
        return abs(r["measured_extra_step_ms"] / (scale * r["predicted_extra_step_ms"]) - 1) \
            > TOLERANCE

    insitu = [r for r in rows if r.get("c_insitu_ms", 0) > 0 and r.get("c_ms", 0) > 0]
    bad = [r for r in rows if off(r, 1.0)]
    text = (f"Measured extra step time within {100 * TOLERANCE:.0f}% of the prediction in "
            f"{len(rows) - len(bad)} of {len(rows)} rows predicting > {MIN_PREDICTED_MS} ms")
    if insitu:
        n_off = sum(off(r, r["c_insitu_ms"] / r["c_ms"]) for r in insitu)
        text += f"; with c as measured in the run, {len(insitu) - n_off} of {len(insitu)}"
    worst = ", ".join(f"{r['protocol']}/{r['policy']} {r['measured_extra_step_ms']:.2f} vs "
                      f"{r['predicted_extra_step_ms']:.2f} ms" for r in bad[:3])
    return text + (f" (off with c calibrated: {worst})." if bad else ".")
