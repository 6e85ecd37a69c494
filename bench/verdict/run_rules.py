"""Whether a run is OK: the one rule set behind the console line, report.md, the gate and
compare, written into the run directory as verdict.json.

A run FAILS when
- the ranks ended a request's prefetch differently, except where pre27010's PP stages did
  (each stage's TP ranks agreeing among themselves): pre27010 has no PP agreement by design
  (SGLang #22607, docs/design.md section 5), so that is reported as a known hazard, not a
  failure;
- a request loaded prefix data that differs from storage, or (SGLang's controller path
  with write_through) SGLang's backup of its pages is not the KV the harness computed;
- a rank's own collective counter differs from torch's sequence numbers (ranks.csv
  `crosscheck_ok`);
- a rank ended a configuration with host slots neither in its radix tree nor free
  (ranks.csv `host_slots_unaccounted`);
- configurations the plan asked for have no rows (the run stopped early: failures.csv);
- under a pinned schedule, two protocols that decide alike ran different schedules in one
  repeat (their schedule digests differ: bench.verdict.schedule_digests). Under a free
  schedule the digests are reported, not judged;
- SGLang's own rank-consensus checker fired (consensus.csv; silent and absent are notes).
Requests refused for their length (terminated_by `rejected`) are counted in a note: the
system refused them as SGLang does, and served the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pandas as pd

from bench.rundir.files import (
    ResultFileError,
    as_bool,
    is_true,
    read_json_object,
    write_json_atomic,
)
from bench.rundir.rundir import FILES
from bench.rundir.schema import DISTURBED_LIMIT
from bench.verdict.schedule_digests import digest_failures

FILE = FILES["verdict"]
# The rules above, named once, with what a failure of each means. judge() states the failed
# ones in the verdict; the gate (bench.gate.evaluate) names its checks after them and
# explains a failing check in these words, so the two never word a rule differently.
RULES = {
    "ranks_agree": "ranks reached different decisions or counts: the protocol is not "
                   "rank-consistent (wrong answers or a hang in production)",
    "data_errors": "load-back copied prefix pages with a wrong checksum: a completion race "
                   "(e.g. PR #27550's extra pool) let a request use half-written data; "
                   "or a backup wrote to storage pages other than the computed KV",
    "counter_crosscheck": "a collective bypassed the counted call sites (or was counted "
                          "twice): the counts are not to be trusted",
    "host_slots": "host slots ended neither in the radix tree nor free: a free was skipped "
                  "(a leak)",
    "configurations_complete": "the run stopped before it finished (failures.csv)",
    "schedule_digests": "under a pinned schedule, protocols that decide alike ran different "
                        "schedules: a decision read something other than the virtual clock "
                        "and the agreed inputs (docs/design.md section 13)",
}
KNOWN_HAZARD = ("pre27010 has no PP agreement (SGLang #22607): its PP stages may end a "
                "prefetch differently")


def known_hazard(protocol: object, disagreement: object) -> bool:
    """A disagreement the protocol permits by design: pre27010's PP stages (each stage's TP
    ranks agreeing among themselves). Every other disagreement is a failure."""
    return protocol == "pre27010" and disagreement == "pp_stages"


def unexplained_disagreements(g: pd.DataFrame) -> pd.Series:
    """Rows whose ranks disagreed (or whose agreement is unknown), known hazards aside."""
    bad = as_bool(g["ranks_agree"]) != True  # noqa: E712 - unknown is not agreement
    if "disagreement" not in g:
        return bad
    known = [known_hazard(p, d) for p, d in zip(g["protocol"], g["disagreement"], strict=True)]
    return bad & ~pd.Series(known, index=g.index, dtype=bool)


def row_disagrees(row: dict) -> bool:
    """A summary row whose ranks disagreed beyond the known hazard: unexplained ones
    counted, or ranks_agree False with no known disagreement to account for it."""
    known, unexplained = row.get("known_disagreements"), row.get("unexplained_disagreements")
    if unexplained is not None and not pd.isna(unexplained) and unexplained > 0:
        return True
    return not is_true(row["ranks_agree"]) and not (
        known is not None and not pd.isna(known) and known > 0)


def rejected(g: pd.DataFrame) -> pd.Series:
    """Rows refused at arrival: a prompt the device KV pool can never hold (SGLang's
    validate_input_length). Served by no rank, so absent from every timing and token figure;
    counted, and no failure."""
    if "terminated_by" not in g:
        return pd.Series(False, index=g.index)
    return g["terminated_by"] == "rejected"


def served(g: pd.DataFrame) -> pd.DataFrame:
    """The rows of requests that were served (every one but the rejected)."""
    return g[~rejected(g)]


def data_errors(g: pd.DataFrame) -> pd.Series:
    """Rows whose loaded data differed from storage."""
    return as_bool(g["data_ok"]) == False  # noqa: E712 - unknown is not an error


def crosscheck_misses(ranks: pd.DataFrame | None) -> pd.DataFrame:
    """ranks.csv rows whose counter disagreed with torch's sequence numbers."""
    if ranks is None or "crosscheck_ok" not in ranks:
        return pd.DataFrame()
    return ranks[as_bool(ranks["crosscheck_ok"]) == False]  # noqa: E712


def host_slot_leaks(ranks: pd.DataFrame | None) -> pd.DataFrame:
    """ranks.csv rows that ended with host slots neither in the tree nor free."""
    if ranks is None or "host_slots_unaccounted" not in ranks:
        return pd.DataFrame()
    leaked = pd.to_numeric(ranks["host_slots_unaccounted"], errors="coerce").fillna(0)
    return ranks[leaked > 0]


def planned_cells(plan: dict | None) -> set[tuple]:
    """(protocol, policy, rate, repeat) of every configuration env.json's plan asked for."""
    if not plan or not all(k in plan for k in ("protocols", "policies", "rates", "repeats")):
        return set()
    return set(product(plan["protocols"], plan["policies"],
                       [float(r) for r in plan["rates"]], range(int(plan["repeats"]))))


def missing_cells(requests: pd.DataFrame, plan: dict | None) -> list[tuple]:
    """Planned configurations with no request rows, in plan order."""
    planned = planned_cells(plan)
    if not planned:
        return []
    have = set(zip(requests["protocol"], requests["policy"],
                   requests["rate_rps"].astype(float), requests["repeat"].astype(int),
                   strict=True)) if len(requests) else set()
    return sorted(planned - have, key=lambda c: (c[3], c[0], c[1], c[2]))


@dataclass(frozen=True)
class Verdict:
    """OK, or FAILED with its reasons; notes are reported but fail nothing."""

    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def line(self) -> str:
        return "OK" if self.ok else f"FAILED: {'; '.join(self.reasons)}"

    def write(self, run_dir: Path) -> None:
        write_json_atomic(Path(run_dir) / FILE, {"ok": self.ok, "line": self.line,
                                                 "reasons": list(self.reasons),
                                                 "notes": list(self.notes)})


def read(run_dir: Path) -> Verdict | None:
    """verdict.json of a run; None for runs written before it existed."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return None
    data = read_json_object(path, ["reasons", "notes"])
    if not all(isinstance(data[k], list) for k in ("reasons", "notes")):
        raise ResultFileError(f"{path}: reasons and notes must be lists")
    return Verdict(tuple(map(str, data["reasons"])), tuple(map(str, data["notes"])))


def _where(row: dict) -> str:
    return f"{row.get('protocol')}/{row.get('policy')} repeat {row.get('repeat')}"


def _first(frame: pd.DataFrame, text) -> str:
    more = f" (and {len(frame) - 1} more)" if len(frame) > 1 else ""
    return text(frame.iloc[0].to_dict()) + more


def _rejected_note(refused: pd.DataFrame) -> str:
    cells = refused.groupby(["protocol", "policy", "repeat"], sort=False).size()
    per = ", ".join(f"{p}/{pol} repeat {rep}: {n}" for (p, pol, rep), n in cells.items())
    longest = int(pd.to_numeric(refused["prompt_tokens"], errors="coerce").max())
    return (f"{len(refused)} request(s) rejected: longer than the device KV pool holds "
            f"(SGLang's validate_input_length; the longest {longest} tokens; {per}); "
            f"served by no rank, counted, not a failure (--kv-budget-gib holds more, "
            f"--allow-auto-truncate cuts them)")


def schedule_failures(requests: pd.DataFrame, plan: dict | None = None) -> list[str]:
    """Pinned serves whose schedule digests differ where they must not (the first one
    named, with how many), bench.verdict.schedule_digests; `plan` says whether every repeat
    replays one seed."""
    if "schedule_digest" not in requests or "schedule" not in requests:
        return []
    keys = ["protocol", "policy", "rate_rps", "repeat", "schedule", "schedule_digest"]
    serves = requests[keys].drop_duplicates()
    pinned = serves[serves["schedule"] == "pinned"].to_dict("records")
    found = digest_failures(pinned, "pinned",
                            same_seed=(plan or {}).get("repeat_seeds") == "same")
    return [found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")] \
        if found else []


# Threads a rank process may gain between its first repeat and its last before the run says
# so: fewer than one gloo group's three (bench.run.machine.threads).
THREAD_SLACK = 2


def disturbed_notes(ranks: pd.DataFrame | None) -> list[str]:
    """How many serves the machine disturbed (bench.run.machine): served again, and still
    disturbed in the serve kept; reported, not a failure (no step time decided it)."""
    if ranks is None or ranks.empty or "attempts" not in ranks:
        return []
    serves = ranks[ranks["rank"] == 0]
    again = pd.to_numeric(serves["attempts"], errors="coerce").fillna(1)
    lost = pd.to_numeric(serves.get("cpu_lost"), errors="coerce")
    kept = int((lost > DISTURBED_LIMIT).sum())
    out = []
    if (again > 1).any():
        extra = int(again.sum() - len(again))
        out.append(f"{int((again > 1).sum())} serve(s) were served again ({extra} extra "
                   f"serves) after the machine lost more than "
                   f"{100 * DISTURBED_LIMIT:.0f}% of its CPU time to steal or other processes "
                   f"(ranks.csv: attempts, cpu_lost)")
    if kept:
        out.append(f"{kept} serve(s) kept were disturbed (cpu_lost above "
                   f"{100 * DISTURBED_LIMIT:.0f}% in ranks.csv): their timings carry outside load")
    return out


def thread_growth_notes(ranks: pd.DataFrame | None) -> list[str]:
    """Rank processes whose threads (ranks.csv `threads`, counted before each serve after a
    collection: bench.run.worker._settled) grew from their first repeat to their last by
    more than THREAD_SLACK: each serve left something running (a process group, a thread)
    beside every later serve, so the timings drift with the repeat. Grouped by protocol as
    well as rank: the sides of a run are processes of their own. Reported, not a failure:
    the counts and data are checked apart."""
    if ranks is None or ranks.empty or "threads" not in ranks:
        return []
    rows = ranks.assign(threads=pd.to_numeric(ranks["threads"], errors="coerce")).dropna(
        subset=["threads"])
    grown = []
    for (protocol, rank), one in rows.groupby(["protocol", "rank"], sort=False):
        first = one[one["repeat"] == one["repeat"].min()]["threads"].min()
        last = one[one["repeat"] == one["repeat"].max()]["threads"].max()
        if last - first > THREAD_SLACK:
            grown.append((protocol, rank, int(first), int(last)))
    if not grown:
        return []
    protocol, rank, first, last = grown[0]
    more = f" (and {len(grown) - 1} more rank process(es))" if len(grown) > 1 else ""
    return [f"rank {rank} of {protocol} held {first} threads before its first repeat and "
            f"{last} before its last{more}: each serve left something running beside the "
            f"later ones, whose timings drift with the repeat (ranks.csv threads)"]


def findings(frame: pd.DataFrame | None) -> tuple[list[str], list[str]]:
    """(reasons the run failed, notes) from consensus.csv's rows: a checker that fired is a
    failure (the ranks' records differed: they parted); silent and absent are notes."""
    if frame is None or not len(frame):
        return [], []
    said = frame["sglang_consensus"].astype(str)
    fired = frame[said.str.startswith("fired")]
    reasons, notes = [], []
    if len(fired):
        r = fired.iloc[0]
        reasons.append(f"SGLang's rank-consensus checker fired in {len(fired)} serve(s) (first: "
                       f"{r['protocol']} {r['policy']} repeat {r['repeat']} {r['serve']}: "
                       f"{r['sglang_consensus']}, {r['consensus_detail']}; consensus.csv)")
    silent = frame[said == "silent"]
    if len(silent):
        counts = pd.to_numeric(silent["checker_collectives"], errors="coerce")
        issued = (f"; its {int(counts.sum())} collectives on its own groups are counted "
                  "apart" if counts.notna().all() else "")
        notes.append(f"SGLang's rank-consensus checker was silent in {len(silent)} of "
                     f"{len(frame)} serve(s){issued}")
    absent = frame[said == "absent"]
    if len(absent):
        notes.append(f"{len(absent)} serve(s) ran an SGLang that ships no rank-consensus "
                     f"checker ({', '.join(sorted(set(absent['protocol'].astype(str))))})")
    return reasons, notes


def judge(requests: pd.DataFrame, ranks: pd.DataFrame | None = None,
          plan: dict | None = None, failures: pd.DataFrame | None = None,
          details: list[str] = (), consensus: pd.DataFrame | None = None) -> Verdict:
    """The run's verdict from its request rows, rank rows, plan (env.json's `plan`) and
    failures.csv; `details` (divergence.csv's disagreement lines) name what the first
    disagreement was; `consensus` (consensus.csv) what SGLang's own checker said."""
    reasons, notes = findings(consensus)
    if failures is not None and len(failures):
        reasons.append(f"the run stopped: {failures.iloc[0]['error']}")
    if len(requests):
        bad = unexplained_disagreements(requests)
        known = int((as_bool(requests["ranks_agree"]) == False).sum() - bad.sum())  # noqa: E712
        if bad.any():
            row = requests[bad].iloc[0].to_dict()
            first = details[0] if details else f"first: request {row['rid']} in {_where(row)}"
            reasons.append(f"ranks disagreed on {int(bad.sum())} request(s) ({first})")
        if known > 0:
            notes.append(f"{known} request(s) of pre27010 ended differently on different PP "
                         f"stages: {KNOWN_HAZARD} (reported, not a failure)")
        refused = requests[rejected(requests)]
        if len(refused):
            notes.append(_rejected_note(refused))
        if data_errors(requests).any():
            reasons.append(f"{int(data_errors(requests).sum())} request(s) loaded or backed "
                           "up data that differs from storage or the computed KV")
        reasons += schedule_failures(requests, plan)
    miss = crosscheck_misses(ranks)
    if len(miss):
        reasons.append(_first(miss, lambda r: f"rank {r.get('rank')}'s collective counter != "
                                              f"torch's sequence numbers in {_where(r)}"))
    leaks = host_slot_leaks(ranks)
    if len(leaks):
        reasons.append(_first(leaks, lambda r: f"rank {r.get('rank')}: "
                                               f"{int(float(r['host_slots_unaccounted']))} host "
                                               f"slot(s) neither in the tree nor free after "
                                               f"{_where(r)}"))
    notes += disturbed_notes(ranks)
    notes += thread_growth_notes(ranks)
    absent = missing_cells(requests, plan)
    if absent:
        p, pol, rate, rep = absent[0]
        reasons.append(f"{len(absent)} planned configuration(s) have no rows (first: {p}/{pol} "
                       f"rate={rate:g} repeat {rep}; see failures.csv)")
    return Verdict(tuple(reasons), tuple(notes))
