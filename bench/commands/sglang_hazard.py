"""`bench sglang-poll --hazard`: the skew cells on SGLang's own poll (bench.run.sglang_hazard),
one per policy, printed as `bench hazards` prints its matrix's rows."""

from __future__ import annotations

from pathlib import Path

from bench.commands.common import UsageError
from bench.tables import markdown_table

COLUMNS = ("scenario", "sglang", "policy", "outcome", "step", "poll_collectives", "gloo",
           "site")


def _cases(args) -> list:
    from bench.run.sglang_hazard import HazardCase

    if args.tp != 2 or args.pp != 1:
        raise UsageError("--hazard runs at TP2 x PP1 (its skew is between two TP ranks)")
    pending = 2 if args.pending_polls is None else args.pending_polls
    try:
        return [HazardCase(args.hazard, p, pending, args.collective_timeout)
                for p in args.policies.split(",") if p]
    except ValueError as e:
        raise UsageError(str(e)) from None


def _out(args) -> Path:
    from bench.rundir.env import short_sha
    from bench.rundir.rundir import RunDir

    return Path(args.out) if args.out else RunDir.new("run", "sglang-hazards",
                                                      short_sha()).path


def hazard_main(args) -> int:
    from bench.hazards.classify import HARNESS
    from bench.run.sglang_hazard import run_hazard
    from sglang_adapter.loader import load
    from sglang_adapter.source import resolve

    cases = _cases(args)  # checked before SPEC is resolved: no download for bad options
    source = resolve(args.sglang)
    load(source)  # an SGLang it cannot drive: one line before any rank starts
    out = _out(args)
    rows, alike = [], True
    for case in cases:
        row = run_hazard(source, case, out)
        if args.twice:
            again = run_hazard(source, case, out, tag="__again")
            row["same_twice"] = again["outcome"] == row["outcome"]
            alike &= row["same_twice"]
        rows.append(row)
        print(f"{case.scenario} x {source.label} x {case.policy}: {row['outcome']} "
              f"{row['detail'][:300]}", flush=True)
    cols = [*COLUMNS, *(("same_twice",) if args.twice else ())]
    print(markdown_table(list(cols), [[str(r[c]) for c in cols] for r in rows]))
    ok = alike and not any(r["outcome"] == HARNESS for r in rows)
    print(f"{'OK' if ok else 'FAILED'} ({len(rows)} cells -> {out})")
    return 0 if ok else 1
