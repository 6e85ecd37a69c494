"""The lead of a run of several SGLangs (`--sglang base=SPEC,pr=SPEC`: bench.run.sglang_worlds):
every other side against the first, end to end and collective by collective.

- The headline: each side's ratios to the reference side (step, TTFT p50 per class, ITL
  p50, e2e p50, the p99s; on a pinned schedule the step alone) with their 95% intervals,
  what the run resolves, which path every side ran, and whose files every call site is.
- Counts side by side: per poll and per step (the free schedule's polls follow timing),
  per call site (file:function:line on each side, matched by its chain of functions), the
  difference from the reference, a call site one side alone has named; under a pinned
  schedule request by request too.
- A side whose decision collectives its release's model does not expect: one line naming
  the policy, the extra per poll and the call site.

All text is built from summary and request rows, so it can be rebuilt from the CSVs.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pandas as pd

from bench.analysis.lead import (
    COST_RATIOS,
    HEADLINE_HEADERS,
    LABELS,
    RATIO_COLUMNS,
    _f,
)
from bench.report.printer import fitted_table, interval_text, wrapped
from bench.rundir.rundir import FILES
from bench.rundir.schema import COUNT_COLUMNS
from hicache.spec.cost_model import POLICIES, modelled
from sglang_adapter import run_unfit

SITES_SHOWN = 12  # call-site rows shown per policy


def side_names(plan: dict | None) -> list[str]:
    """The sides' protocol names of a run's plan (env.json), the reference first; [] for
    any other run."""
    return [s["name"] for s in (plan or {}).get("sides") or []]


def lead_text(summary: pd.DataFrame, requests: pd.DataFrame, plan: dict) -> list[str]:
    """The terminal's lead of a run of several SGLangs."""
    return wrapped(["", *headline_lines(summary, plan), "",
                    *counts_text(summary, requests, plan, site_summary_lines)])


def _side_rows(summary: pd.DataFrame, plan: dict) -> tuple[list[dict], bool]:
    """The sides' summary rows by policy, then side; whether the run was end to end (the
    free schedule: what a server sees)."""
    names = side_names(plan)
    rows = [r for r in summary.to_dict("records") if r["protocol"] in names]
    rows.sort(key=lambda r: (_index(POLICIES, r["policy"]), names.index(r["protocol"])))
    end_to_end = bool(rows) and all(str(r.get("schedule")) in ("free", "None", "nan")
                                    for r in rows)
    return rows, end_to_end


def headline_lines(summary: pd.DataFrame, plan: dict) -> list[str]:
    """Every side's ratios to the reference with their intervals, what the run resolves,
    which path ran and whose files every call site is."""
    ref = side_names(plan)[0]
    rows, end_to_end = _side_rows(summary, plan)
    ratios = RATIO_COLUMNS if end_to_end else COST_RATIOS
    title = ("end to end, free schedule" if end_to_end else
             "pinned schedule (host cost on one schedule, not a TTFT or ITL effect)")
    headers = HEADLINE_HEADERS if end_to_end else HEADLINE_HEADERS[:5]
    table = [[r["protocol"], r["policy"], _f(r["polls_per_step"], ".1f"),
              _f(r["step_mean_ms"], ".1f"), *[_ratio(r, n, ref) for n in ratios]]
             for r in rows]
    return [f"SGLang sides, ratios to {ref} [95% CI over repeats], {title}; "
            f"{path_line(plan)}:", *fitted_table(["side", *headers[1:]], table),
            *resolution(rows, ref, ratios), own_files_line(plan)]


def counts_text(summary: pd.DataFrame, requests: pd.DataFrame, plan: dict,
                sites_by=None) -> list[str]:
    """The counts side by side and the decision collectives a side's model does not
    expect; the call sites by `sites_by` (site_lines: every chain in full, as a page or
    call_sites.txt has them; site_summary_lines: short, as the console has them)."""
    names = side_names(plan)
    rows, end_to_end = _side_rows(summary, plan)
    return [*count_lines(rows, requests, names, end_to_end, sites_by or site_lines),
            *unexpected_lines(rows, requests, names[0])]


def _index(seq: tuple, value: object) -> int:
    return seq.index(value) if value in seq else len(seq)


def _ratio(row: dict, name: str, ref: str) -> str:
    if row["protocol"] == ref:
        return "1 (ref)"
    return interval_text(row.get(f"{name}_ratio"), row.get(f"{name}_ratio_ci_low"),
                         row.get(f"{name}_ratio_ci_high"))


def path_line(plan: dict) -> str:
    """Which path every side ran (one for all: sglang_adapter.side_specs), and why where it is
    the decisions path."""
    sides = plan.get("sides") or []
    if all(s["controller"] for s in sides):
        return "every side on SGLang's controller path"
    hiradix = [s["name"] for s in sides if s["family"] != "unified"]
    why = (f"{hiradix[0]} builds HiRadixCache" if hiradix else
           run_unfit(int(plan.get("pp", 1)), plan.get("system") or {}))
    return "every side on SGLang's decisions path" + (f" ({why})" if why else "")


def own_files_line(plan: dict) -> str:
    """Each side's call sites are files of its own SPEC: the ranks fail the run otherwise
    (sglang_adapter.door.Door.own_files)."""
    return "Call sites: each side's from its own SPEC (" + "; ".join(
        f"{s['name']} under {s['root']}" for s in plan.get("sides") or []) + ")."


def resolution(rows: list[dict], ref: str, ratios: list[str]) -> list[str]:
    """Per ratio the largest 95% half-width over the non-reference rows, and whether every
    interval holds 1 (an A/A's must)."""
    others = [r for r in rows if r["protocol"] != ref]
    widths = {n: [r[f"{n}_ratio_mdd"] for r in others
                  if not pd.isna(r.get(f"{n}_ratio_mdd", math.nan))] for n in ratios}
    parts = [f"{LABELS[n]} {100 * max(w):.1f}%" for n, w in widths.items() if w]
    if not parts:  # why, as the intervals said it (too few repeats, no scipy)
        notes = [r.get("interval_note") for r in others
                 if isinstance(r.get("interval_note"), str) and r.get("interval_note")]
        return [f"No intervals: {notes[0]}." if notes else "No intervals."]
    off = [f"{r['protocol']}/{r['policy']} {LABELS[n]}" for r in others for n in ratios
           if r.get(f"{n}_ratio_ci_low", math.nan) > 1
           or r.get(f"{n}_ratio_ci_high", math.nan) < 1]
    return [f"Resolvable differences (the largest 95% half-width): {', '.join(parts)}.",
            "Every ratio's interval holds 1." if not off else
            f"Intervals excluding 1: {', '.join(off)}."]


def count_lines(rows: list[dict], requests: pd.DataFrame, names: list[str],
                end_to_end: bool, sites_by=None) -> list[str]:
    """Counts side by side: per poll and per step, per call site, per request (pinned)."""
    ref = names[0]
    out = ["Counts side by side (decision collectives per poll, step collectives per step; "
           f"the difference from {ref}):"]
    by = {(r["protocol"], r["policy"]): r for r in rows}
    for r in rows:
        base = by.get((ref, r["policy"]), r)
        per_poll = _f(r["decision_collectives_per_poll"], ".3f")
        out.append(f"- {r['protocol']}/{r['policy']}: {per_poll} per poll "
                   f"({_delta(r, base, 'decision_collectives_per_poll')}), "
                   f"{_f(r['step_collectives_per_step'], '.2f')} per step "
                   f"({_delta(r, base, 'step_collectives_per_step')}), "
                   f"{_f(r['polls_per_req'], '.1f')} polls/req")
    out += (sites_by or site_lines)(requests, names)
    if not end_to_end:
        out += request_lines(requests, names)
    return out


def _delta(r: dict, base: dict, column: str) -> str:
    if r is base or r["protocol"] == base["protocol"]:
        return "ref"
    d = r[column] - base[column]
    return "same" if not pd.isna(d) and abs(d) < 1e-9 else f"{d:+.3f}"


def sites(requests: pd.DataFrame) -> dict[str, Counter]:
    """Chain without line numbers -> Counter of the chain as written (with its lines)."""
    out: dict[str, Counter] = {}
    for text in requests["call_sites"].dropna().astype(str):
        for part in filter(None, text.split("; ")):
            n, _, where = part.partition("x ")
            out.setdefault(re.sub(r":\d+", "", where), Counter())[where] += int(n)
    return out


SITES_FILE = FILES["call_sites"]  # every chain in full, with its lines


def _site_counts(requests: pd.DataFrame, names: list[str]):
    """Per policy: each side's found sites (sites()) and polls, and the chains shown."""
    for policy, g in requests.groupby("policy", sort=False):
        per = {n: g[g["protocol"] == n] for n in names}
        polls = {n: max(int(x["polls"].sum()), 1) for n, x in per.items()}
        found = {n: sites(x) for n, x in per.items()}
        keys = sorted({k for f in found.values() for k in f})
        yield policy, polls, found, keys


def short_site(key: str) -> str:
    """A chain as the console names it: the collective, the file and the two innermost
    functions, and how many callers more (call_sites.txt has them all)."""
    head, _, chain = key.partition(" ")
    frames = chain.split(" < ")
    more = f" (+{len(frames) - 2})" if len(frames) > 2 else ""
    return f"{head} {' < '.join(frames[:2])}{more}"


def site_summary_lines(requests: pd.DataFrame, names: list[str]) -> list[str]:
    """Per policy and call site, short: each side's count per poll at the chain (its two
    innermost functions), '-' for a side without it; every chain in full, each side's at
    its own lines, is site_lines' (call_sites.txt)."""
    out = [f"Call sites, collectives per poll by side (every chain in full: {SITES_FILE}):"]
    for policy, polls, found, keys in _site_counts(requests, names):
        for key in keys[:SITES_SHOWN]:
            counts = ", ".join(f"{n} {sum(found[n][key].values()) / polls[n]:.3f}"
                               if key in found[n] else f"{n} -" for n in names)
            out.append(f"  {policy}: {short_site(key)}: {counts}")
    return out


def site_lines(requests: pd.DataFrame, names: list[str]) -> list[str]:
    """Per policy and call site: each side's count per poll at its own line; a site one
    side alone has is named."""
    out = []
    for policy, polls, found, keys in _site_counts(requests, names):
        for key in keys:
            have = [n for n in names if key in found[n]]
            cells = [f"{n} {sum(found[n][key].values()) / polls[n]:.3f}/poll at "
                     f"{'/'.join(sorted(found[n][key]))}" for n in have]
            alone = f" (only {', '.join(have)})" if len(have) < len(names) else ""
            out.append(f"  {policy} site{alone}: " + "; ".join(cells))
    return out


def request_lines(requests: pd.DataFrame, names: list[str]) -> list[str]:
    """Pinned: each side against the reference request by request (one schedule per
    seed, so requests pair by policy, repeat and rid)."""
    keys = ["policy", "repeat", "rid"]
    counts = [c for c in COUNT_COLUMNS if c in requests]
    ref = requests[requests["protocol"] == names[0]][keys + counts]
    out = []
    for name in names[1:]:
        both = ref.merge(requests[requests["protocol"] == name][keys + counts], on=keys,
                         suffixes=("_ref", "")).fillna(-1)  # a count neither has: equal
        differ = both[(both[[f"{c}_ref" for c in counts]].to_numpy()
                       != both[counts].to_numpy()).any(axis=1)]
        first = "" if differ.empty else "; first: " + ", ".join(
            f"{r.policy} repeat {r.repeat} {r.rid}" for r in differ.head(3).itertuples())
        out.append(f"Per request, {name} against {names[0]}: {len(both) - len(differ)} of "
                   f"{len(both)} equal in every count ({', '.join(counts)}){first}")
    return out


def unexpected(rows: list[dict], requests: pd.DataFrame, ref: str
               ) -> list[tuple[dict, float, list[str]]]:
    """Each side cell issuing decision collectives its release's model does not expect:
    its summary row, the extra per poll, and the decision call sites it has more of per
    poll than the reference side's cell (all of its own for the reference)."""
    out = []
    for r in rows:
        extra = r["decision_collectives_per_req"] - r["expected_decision_collectives_per_req"]
        if pd.isna(extra) or extra <= 1e-9:
            continue
        g = _cell(requests, r["protocol"], r["policy"])
        per_poll = extra * len(g) / max(int(g["polls"].sum()), 1)
        out.append((r, per_poll, _more(g, _cell(requests, ref, r["policy"])
                                       if r["protocol"] != ref else None)))
    return out


def unexpected_lines(rows: list[dict], requests: pd.DataFrame, ref: str) -> list[str]:
    """`unexpected`'s cells, a line each: the policy, the extra per poll, the call sites."""
    return [f"{r['protocol']} under {r['policy']}: {per_poll:+.3f} decision "
            f"collectives per poll its release's model ({modelled(r['protocol'])}) "
            f"does not expect, at {', '.join(where) or 'no call site recorded'}"
            for r, per_poll, where in unexpected(rows, requests, ref)]


def _cell(requests: pd.DataFrame, protocol: str, policy: str) -> pd.DataFrame:
    return requests[(requests["protocol"] == protocol) & (requests["policy"] == policy)]


# The groups a poll's decision collectives run on (the scheduler's TP and PP CPU groups);
# the controller threads' hit-query and ack groups carry none, and their rate per poll moves
# whenever polls per request do (the free schedule), so they never explain an extra.
DECISION_GROUPS = ("tp_cpu", "pp_cpu")


def _decision_site(where: str) -> bool:
    return where.split(" ", 1)[0].partition("@")[2] in DECISION_GROUPS


def _more(g: pd.DataFrame, ref: pd.DataFrame | None) -> list[str]:
    """The decision call sites (as written) `g` issues more of per poll than `ref` (all:
    None)."""
    mine, theirs = sites(g), sites(ref) if ref is not None else {}
    mine = {k: c for k, c in mine.items() if _decision_site(k)}
    polls = max(int(g["polls"].sum()), 1)
    ref_polls = max(int(ref["polls"].sum()), 1) if ref is not None else 1
    return sorted(w for k, c in mine.items()
                  if sum(c.values()) / polls >
                  sum(theirs.get(k, Counter()).values()) / ref_polls + 1e-9
                  for w in c)


def count_changes(summary: pd.DataFrame, requests: pd.DataFrame, plan: dict,
                  explained: tuple[str, ...] = ()) -> list[str]:
    """The count differences a strict review fails on (`bench review --strict-counts`),
    a reason each: a call site (file:function, lines aside) that a side has and the
    reference lacks, or the other way round; decision collectives a side's release model
    does not expect; and on a pinned schedule (one schedule per seed, so rates are exact)
    a call site whose collectives per poll differ from the reference's. A reason is dropped
    when every call site it names contains one of `explained` (the sites the change is
    meant to touch, e.g. `unified_radix_cache.py:_can_terminate_prefetch`)."""
    names = side_names(plan)
    rows, end_to_end = _side_rows(summary, plan)

    def known(where: list[str]) -> bool:
        return bool(where) and all(any(p in w for p in explained) for w in where)

    out = []
    for policy, g in requests.groupby("policy", sort=False):
        per = {n: g[g["protocol"] == n] for n in names}
        found = {n: sites(x) for n, x in per.items()}
        polls = {n: max(int(x["polls"].sum()), 1) for n, x in per.items()}
        ref = names[0]
        for name in names[1:]:
            for key in sorted(set(found[name]) ^ set(found[ref])):
                who = name if key in found[name] else ref
                if not known([key]):
                    out.append(f"{policy}: call site {key} on {who} only "
                               f"({', '.join(sorted(found[who][key]))})")
            if end_to_end:
                continue  # free: polls follow timing, so a rate is not a count to hold
            for key in sorted(set(found[name]) & set(found[ref])):
                mine = sum(found[name][key].values()) / polls[name]
                theirs = sum(found[ref][key].values()) / polls[ref]
                if abs(mine - theirs) > 1e-9 and not known([key]):
                    out.append(f"{policy}: {name} {mine:.3f}/poll at {key} against "
                               f"{ref}'s {theirs:.3f}")
    for r, _, where in unexpected(rows, requests, names[0]):
        if not known([re.sub(r":\d+", "", w) for w in where]):
            out.append(f"{r['protocol']} under {r['policy']}: decision collectives its "
                       f"release's model ({modelled(r['protocol'])}) does not expect, at "
                       f"{', '.join(where) or 'no call site recorded'}")
    return out
