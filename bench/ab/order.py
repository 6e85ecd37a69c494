"""`bench ab`'s check on itself: does running second in a block pair change a timing, and
does one side win every block? Per configuration and gated metric, from the merged runs:

- the order effect: per block, the metric of the run that ran second over the one that ran
  first (B/A in an A B block, A/B in a B A block), exp(mean of ln) with a 95% t interval
  over the blocks. With the order drawn balanced from the seed (blocks.AbPlan.order), B/A
  stays free of it, but an interval that excludes 1 says the block runs were not alike;
- the blocks' sides: how many blocks had B/A above 1 (favour A: B was slower) and below;
  all of them on one side is flagged (a t interval over 6 pairs cannot see that alone);
- beside the t interval of B/A, the Wilcoxon signed-rank and the sign test on the
  per-block ln(B/A), which assume no normality, for 6-12 pairs (Wilcoxon from scipy.stats:
  without scipy its p is empty and the section says why; the sign test is exact, from
  math.comb).
"""

from __future__ import annotations

import math

import numpy as np

from bench.compare.comparison import Comparison
from bench.compare.metrics import TIMING_METRICS
from bench.report.printer import interval_text, markdown_table
from bench.rundir.files import clean_key
from bench.rundir.schema import GATED_METRICS
from bench.stats import (
    NO_SCIPY,
    per_repeat_ratios,
    ratio_interval,
    scipy_available,
    sign_test_p,
    wilcoxon_p,
)

GATED = {f"{m}_ms" for m in GATED_METRICS}
COLUMNS = ["second_over_first", "order_ci_low", "order_ci_high", "blocks_favour_a",
           "blocks_favour_b", "wilcoxon_p", "sign_p", "order_warning"]
HEADERS = ["configuration", "metric", "2nd/1st [95% CI]", "favour A / B", "Wilcoxon p",
           "sign p", "warning"]


def rank_tests(ratios: list[float]) -> tuple[float | None, float | None]:
    """(Wilcoxon signed-rank p, sign-test p) of ln(ratios) against 0, two-sided; None
    with fewer than 2 pairs or when every pair is a tie. The sign test is exact without
    scipy; the Wilcoxon p is None where scipy is missing (order_section says so)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    logs = logs[logs != 0]
    if logs.size < 2:
        return None, None
    return wilcoxon_p(logs), sign_test_p(int((logs > 0).sum()), int(logs.size))


def _pairs(comp: Comparison, key: tuple, metric, groups: dict) -> dict[int, float]:
    """Repeat -> B/A of the metric in one configuration (`key`: its clean comp.keys);
    `groups` holds each run's tables split by configuration, filled on first use."""
    def side(run) -> dict[int, float]:
        frame = run.table(metric.table)
        if frame is None or not metric.present(frame.columns):
            return {}
        cache = (id(run), metric.table)
        if cache not in groups:
            groups[cache] = {clean_key(k): g for k, g in frame.groupby(
                comp.keys, dropna=False, sort=False)}
        rows = groups[cache].get(key)
        return {} if rows is None else metric.sample(rows).per_repeat(metric.stat)
    a, b = (side(run) for run in (comp.a, comp.b))
    return per_repeat_ratios(b, a)


def order_row(ratios: dict[int, float], b_first: dict[int, bool]) -> dict:
    """The order-effect cells of one configuration and metric from its per-repeat B/A
    (`b_first`: whether B ran first in that repeat's block)."""
    second = {r: (1 / v if b_first[r] else v) for r, v in ratios.items()}
    iv = ratio_interval(second, dict.fromkeys(second, 1.0))
    above = sum(v > 1 for v in ratios.values())
    below = sum(v < 1 for v in ratios.values())
    wilcoxon, sign = rank_tests(list(ratios.values()))
    warnings = []
    if iv.has_interval and not iv.low <= 1 <= iv.high:
        warnings.append(f"order effect: the run second in a block is {iv.point:.3f}x the "
                        f"first [{iv.low:.3f}, {iv.high:.3f}], excluding 1")
    n = len(ratios)
    if n >= 3 and (above == n or below == n):
        # identical code puts all n blocks on one side with probability 2 / 2**n
        warnings.append(f"all {n} blocks favour {'A' if above == n else 'B'} (identical "
                        f"code does so in 1 metric of {2 ** (n - 1)} by chance)")
    return {"second_over_first": iv.point, "order_ci_low": iv.low, "order_ci_high": iv.high,
            "blocks_favour_a": above, "blocks_favour_b": below, "wilcoxon_p": wilcoxon,
            "sign_p": sign, "order_warning": "; ".join(warnings)}


def annotate(comp: Comparison, b_first_block: dict[int, bool], per_block: int) -> None:
    """Adds the order-effect cells to every gated timing row of `comp` (ab.csv's extra
    columns), a warning line per flagged row and ab.md's "Order effect" section."""
    metrics = {m.name: m for m in TIMING_METRICS}
    flagged, table, groups = [], [], {}
    for row in comp.rows:
        if row.get("kind") != "timing" or row["metric"] not in GATED:
            continue
        ratios = _pairs(comp, tuple(row[k] for k in comp.keys), metrics[row["metric"]],
                        groups)
        if not ratios:
            continue
        row |= order_row(ratios, {r: b_first_block[r // per_block] for r in ratios})
        name = f"{row['protocol']}/{row['policy']}"
        if row["order_warning"]:
            flagged.append(f"warning: {name} {row['metric']}: {row['order_warning']}")
        table.append([name, row["metric"], interval_text(
            row["second_over_first"], row["order_ci_low"], row["order_ci_high"], ".3f"),
            f"{row['blocks_favour_a']} / {row['blocks_favour_b']}", _p(row["wilcoxon_p"]),
            _p(row["sign_p"]), row["order_warning"]])
    comp.header += flagged
    comp.extra_columns += [c for c in COLUMNS if c not in comp.extra_columns]
    comp.sections += order_section(table, len(flagged))


def _p(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"


def order_section(table: list[list[str]], flagged: int) -> list[str]:
    return ["## Order effect", "",
            f"Order effect: {flagged} gated metric(s) flagged." if table else
            "Order effect: no gated timing with paired blocks.", "",
            "Per block, the run that ran second over the one that ran first (95% t interval "
            "over the blocks; warned when it excludes 1), how many blocks had B/A above 1 "
            "(favour A) and below (favour B), flagged when all of them fall on one side, and "
            "beside the t interval of B/A the Wilcoxon signed-rank and sign tests of "
            "ln(B/A) (two-sided p).", "",
            *([f"No Wilcoxon p: {NO_SCIPY} (the sign test's is exact without it).", ""]
              if table and not scipy_available() else []),
            *([markdown_table(HEADERS, table), ""] if table else [])]
