"""CI perf gate: exact collective counts, correctness, and same-run TTFT ratios vs a baseline
(the engine of `python -m bench gate`, bench.commands.gate).

Hard checks are exact (counts never depend on timing): measured decision and background
collectives equal the analytic model (hicache.spec.cost_model) for every request, every rank
agreed, no data errors, and no protocol spends more decision collectives per poll than the
committed baseline. The timing checks (bench.gate.timing) use between-repeat intervals: with
--ab the baseline revision and this tree serve as sides of one run on this machine
(bench.ab.served) and each configuration's mean step time, ITL p50 and TTFT p50 per request
class passes when its whole 95% interval of B/A lies below 1 + the metric's threshold
(gate.json), fails when it lies above; one still undecided at the budget is INCONCLUSIVE on
a disturbed machine and FAIL on a quiet one (bench.gate.timing); without --ab this run's
ratios to pr27010 are held against the baseline's, paired by repeat. The verdict and exit
code: bench.gate.outcome; with --ab it is written to RUN/ab/decision.json. When the run
directory holds microbench.json, the per-poll cost ratios are printed as information, never
checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.ab.served import AB_METRICS
from bench.analysis.summarize import (
    background_collectives,
    config_groups,
    expected_counts,
    summarize,
)
from bench.gate.ab import ServedAb, check_served, run_gate_served
from bench.gate.baseline import (
    baseline_value,
    check_comparable,
    load_baseline,
    read_settings,
    update_baseline,
)
from bench.gate.host_ceiling import host_work_checks, with_ceilings
from bench.gate.outcome import GateOutcome, gate_decision
from bench.gate.timing import (
    ab_checks,
    ab_states,
    baseline_checks,
    settle,
)
from bench.microbench import gate_note
from bench.rundir import decision as decision_file
from bench.rundir.decision import Disturbance
from bench.rundir.files import (
    clean_key,
)
from bench.rundir.rundir import RunDir
from bench.rundir.schema import GROUP_KEYS, STEP_COLUMNS
from bench.verdict.checks import Check, make_check, verdict_of
from bench.verdict.exact import at_most, close
from bench.verdict.run_rules import (
    RULES,
    crosscheck_misses,
    data_errors,
    host_slot_leaks,
    missing_cells,
    row_disagrees,
    schedule_failures,
    unexplained_disagreements,
)
from bench.verdict.thresholds import DEFAULT_THRESHOLD


def _count_meaning(site: str, protocol: str, expected: int, observed: int) -> str:
    """One sentence on what a measured count differing from the model means."""
    if site == "background":
        more = "more" if observed > expected else "fewer"
        return (f"{protocol}'s hit-query/ack threads issued {more} collectives than the model "
                "(per hit query and per 128-page batch one MIN over TP, then PP for the ack "
                "protocols; the final ack is free; one ticket broadcast on 0.5.23's PP-ticket "
                "path): the background agreement changed")
    if observed > expected and expected == 0:
        return (f"{protocol} issued a collective in a poll that needs none: a collective was "
                "added to the hot path")
    if observed > expected:
        return (f"{protocol} issued more decision collectives than polls x (T + P): a "
                "collective was added to the hot path")
    return (f"{protocol} issued fewer decision collectives than the model: a poll skipped its "
            "rank agreement, or the counter misses a call site")


def _exact_check(row: dict, g: pd.DataFrame, site: str) -> Check:
    """Per request (exact) and per summary row: measured `site` collectives == the model."""
    column = "decision_collectives" if site == "decision" else None
    measured = g[column] if column else background_collectives(g)
    expected = expected_counts(g)[site]
    bad = measured.astype(int) != expected
    name = f"{site}_exact"
    if bad.any():
        first = g[bad].iloc[0]
        exp, obs = int(expected[bad].iloc[0]), int(measured[bad].iloc[0])
        return make_check(row, name, False, expected=f"{exp} (rid {first['rid']}, repeat "
                      f"{first['repeat']})", observed=f"{obs}; {int(bad.sum())} requests off",
                      meaning=_count_meaning(site, row["protocol"], exp, obs))
    got = row[f"{site}_collectives_per_req"]
    want = row[f"expected_{site}_collectives_per_req"]
    if not close(got, want):
        return make_check(row, name, False, expected=f"{want:.4f}/req", observed=f"{got:.4f}/req",
                      meaning="summary.csv disagrees with requests.csv and the model: the "
                              "summary is stale or was edited; rebuild it with bench report")
    return make_check(row, name, True)


def _agree_check(row: dict, g: pd.DataFrame) -> Check:
    """Every request's ranks agreed, in requests.csv and in the summary row."""
    bad = unexplained_disagreements(g)
    if bad.any() or row_disagrees(row):
        where = f" (first rid {g[bad].iloc[0]['rid']})" if bad.any() else ""
        return make_check(row, "ranks_agree", False, expected="True",
                      observed=f"False in {int(bad.sum())} of {len(g)} requests{where}",
                      meaning=RULES["ranks_agree"])
    return make_check(row, "ranks_agree", True)


def _data_check(row: dict, g: pd.DataFrame) -> Check:
    """No request read wrong prefix data (checksum mismatch)."""
    bad = int(data_errors(g).sum())
    errors = max(bad, int(row["data_errors"]))
    if errors:
        return make_check(row, "data_errors", False, expected="0", observed=str(errors),
                      meaning=RULES["data_errors"])
    return make_check(row, "data_errors", True)


def _self_checks(row: dict, ranks: pd.DataFrame | None) -> list[Check]:
    """Each rank's own checks (bench.verdict.run_rules): its counter matched torch's
    sequence numbers, and every host slot was in its tree or free at the end. Nothing to
    check without ranks.csv."""
    if ranks is None:
        return []
    miss, leaks = crosscheck_misses(ranks), host_slot_leaks(ranks)
    out = [make_check(row, "counter_crosscheck", miss.empty, expected="every rank's counter "
                      "== torch's sequence numbers", observed=f"{len(miss)} rank row(s) differ",
                      meaning="" if miss.empty else RULES["counter_crosscheck"])]
    out.append(make_check(row, "host_slots", leaks.empty, expected="0 unaccounted",
                          observed=f"{len(leaks)} rank row(s) with leaked slots",
                          meaning="" if leaks.empty else RULES["host_slots"]))
    return out


def _schedule_checks(requests: pd.DataFrame, plan: dict | None = None) -> list[Check]:
    """Pinned runs: the schedule digests of protocols that decide alike are equal (the
    verdict's rule, bench.verdict.schedule_digests); free runs have nothing to judge here."""
    if "schedule" not in requests or not (requests["schedule"] == "pinned").any():
        return []
    failed = schedule_failures(requests, plan)
    row = {"protocol": "-", "policy": "-", "tp": "-", "pp": "-", "storage": "-",
           "rate_rps": "-", "extra_pool": False}
    return [make_check(row, "schedule_digests", not failed, expected="one schedule per "
                       "decide-alike group and seed", observed=failed[0] if failed else "equal",
                       meaning=RULES["schedule_digests"] if failed else "")]


def run_checks(requests: pd.DataFrame, summary: pd.DataFrame,
               ranks: pd.DataFrame | None = None, plan: dict | None = None) -> list[Check]:
    """The hard checks that need no baseline, for every summary row; `ranks` (ranks.csv) and
    `plan` (env.json's) add the ranks' self-checks and the planned configurations."""
    groups = config_groups(requests)
    rank_groups = config_groups(ranks) if ranks is not None else {}
    checks = []
    for row in summary.to_dict("records"):
        key = clean_key(tuple(row[k] for k in GROUP_KEYS))
        g = groups.pop(key, requests.iloc[:0])
        checks += [_exact_check(row, g, "decision"), _exact_check(row, g, "background"),
                   _agree_check(row, g), _data_check(row, g)]
        checks += _self_checks(row, None if ranks is None else
                               rank_groups.get(key, ranks.iloc[:0]))
    absent = missing_cells(requests, plan)
    if absent:
        p, pol, rate, rep = absent[0]
        row = {"protocol": p, "policy": pol, "tp": "-", "pp": "-", "storage": "-",
               "rate_rps": rate, "extra_pool": False}
        checks.append(make_check(row, "configurations_complete", False,
                                 expected="every planned configuration",
                                 observed=f"{len(absent)} missing (first: repeat {rep})",
                                 meaning=RULES["configurations_complete"]))
    checks += _schedule_checks(requests, plan)
    for key in groups:  # requests the summary does not cover: a stale summary.csv
        row = dict(zip(GROUP_KEYS, key, strict=True))
        checks.append(make_check(row, "summary_covers_requests", False, expected="a summary row",
                             observed="none", meaning="summary.csv is stale: rebuild it with "
                                                      "bench report"))
    return checks


def per_poll_checks(summary: pd.DataFrame, baseline: pd.DataFrame) -> list[Check]:
    """No more decision collectives per poll than the baseline, per layout."""
    checks = []
    for row in summary.to_dict("records"):
        base = baseline_value(baseline, row, "decision_collectives_per_poll")
        got = row["decision_collectives_per_poll"]
        if math.isnan(base) or pd.isna(got):  # no baseline for this layout, or no polls
            continue
        ok = at_most(got, base)
        checks.append(make_check(
            row, "per_poll_vs_baseline", ok, expected=f"<= {base:.4f}", observed=f"{got:.4f}",
            meaning="" if ok else f"{row['protocol']} spends more decision collectives per "
                                  "poll than the committed baseline: a collective was added "
                                  "to every poll"))
    return checks


@dataclass(frozen=True)
class GatedRun:
    requests: pd.DataFrame
    summary: pd.DataFrame
    ranks: pd.DataFrame | None  # ranks.csv, when the run has one
    env: dict  # env.json ({} for runs without one)


def load_run(run_dir: Path) -> GatedRun:
    """requests.csv, summary.csv (rebuilt with summarize when absent), ranks.csv and
    env.json of a run."""
    run = RunDir(run_dir).check_dir()
    requests = run.requests("gate")
    summary = run.summary("gate", optional=True)
    if summary is None:
        steps = run.steps(optional=True)
        summary = summarize(requests, pd.DataFrame(columns=STEP_COLUMNS) if steps is None
                            else steps)
    return GatedRun(requests, summary, run.ranks(), run.env(optional=True) or {})


def thresholds(settings: dict, override: float | None) -> dict[str, float]:
    """Each gated metric's threshold: --tolerance for all, else gate.json's `thresholds`
    (bench noise --update-gate), else DEFAULT_THRESHOLD."""
    if override is not None:
        return dict.fromkeys(AB_METRICS, override)
    return {m: settings.get("thresholds", {}).get(m, DEFAULT_THRESHOLD) for m in AB_METRICS}


@dataclass(frozen=True)
class GateOptions:
    """What `bench gate` was asked (bench.commands.gate unpacks its command line into it)."""

    run_dir: Path
    baseline: Path = Path("results/baseline")
    ab: bool = False  # timings from an A/B of the baseline revision beside this tree
    tolerance: float | None = None  # one threshold for every timing metric
    update_baseline: bool = False


@dataclass(frozen=True)
class Timings:
    """The timing checks (not yet settled), a line on how they were made, the disturbance
    their serves saw, and the served A/B (None without --ab)."""

    checks: list[Check]
    how: str
    disturbance: Disturbance
    served: ServedAb | None = None


def timing_checks(args: GateOptions, run: GatedRun, baseline: pd.DataFrame,
                  settings: dict) -> Timings:
    """The timing checks (bench.gate.timing) and how they were made."""
    limits = thresholds(settings, args.tolerance)
    shown = ", ".join(f"{m} {limits[m]:g}" for m in AB_METRICS if m != "ttft")
    if not args.ab:
        return Timings(baseline_checks(run.summary, baseline, limits), (
            f"timings against the baseline's numbers, paired by repeat;\n  thresholds {shown};\n"
            "  drift between the two runs is not in the intervals: --ab runs the baseline "
            "revision beside this tree instead"), Disturbance.from_ranks([run.ranks]))
    check_served(settings, args.baseline)
    served = run_gate_served(settings, args.run_dir / "ab", lambda c: ab_states(c, limits))
    comp = served.comp
    return Timings(ab_checks(comp, limits), (
        f"timings: {comp.final_line()} for this tree (B) against the baseline revision\n"
        f"  {comp.a.fact('git', 'commit') or ''} (A), sides of one run on this machine, "
        f"{served.pairs} paired repeats in {served.seconds:.0f}s;\n"
        f"  thresholds {shown};\n  {served.out / 'ab.md'}"), served.disturbance, served)


def evaluate(args: GateOptions) -> GateOutcome:
    """Evaluate every check (and update the baseline when asked): the gate's outcome, with
    RUN/ab/decision.json written when the timings came from a served A/B."""
    run = load_run(args.run_dir)
    summary = run.summary
    checks = run_checks(run.requests, summary, run.ranks, run.env.get("plan"))
    if args.update_baseline:
        if all(c.passed for c in checks):
            settings = with_ceilings(read_settings(args.baseline), run.ranks,
                                     args.run_dir.resolve().name)
            line = update_baseline(args.run_dir, args.baseline, summary, settings, run.env)
            return GateOutcome(checks, line, verdict_of(checks))
        return GateOutcome(checks, "baseline NOT updated", verdict_of(checks))
    check_comparable(run.env, args.baseline)
    baseline, settings = load_baseline(args.baseline)
    timings = timing_checks(args, run, baseline, settings)
    checks += per_poll_checks(summary, baseline) + host_work_checks(summary, run.ranks,
                                                                     settings)
    checks += settle(timings.checks, timings.disturbance)
    # Micro-benchmark ratios ride along as information: per-poll timings are noise here.
    note = gate_note(args.run_dir)
    how = f"{timings.how}\n  baseline {args.baseline}" + (f"\n{note}" if note else "")
    written = None
    if timings.served is not None:
        limits = thresholds(settings, args.tolerance)
        written = decision_file.write(gate_decision(checks, timings.served, settings, limits),
                                      timings.served.out)
        how += f"\n  {written}"
    return GateOutcome(checks, how, verdict_of(checks), timings.disturbance, written)
