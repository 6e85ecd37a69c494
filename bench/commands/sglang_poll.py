"""Usage: python -m bench sglang-poll --sglang SPEC [--tp N] [--pp N] [--policies P,..]
                                    [--pending-polls K]
       python -m bench sglang-poll --sglang SPEC --controller
       python -m bench sglang-poll --sglang SPEC --hazard walk-skew|ongoing-skew
                                    [--policies P,..] [--collective-timeout S] [--twice]
                                    [--out DIR]

Runs SGLang's own UnifiedRadixCache poll (check_prefetch_progress, _can_terminate_prefetch,
_all_reduce/_pp_sync, as shipped) on TP x PP gloo ranks of this machine, one pending
prefetch per policy polled K times and once more to end it, each step after SGLang's
check_hicache_events, and counts every collective SGLang issues at its call site. Per
request: SGLang's decision collectives per poll and per-step collectives beside the
project's model of the release (0.5.18: pre27010, 0.5.19: pr36425, 0.5.23 and trees:
sglang-0.5.23).

SPEC: a release (0.5.23: fetched once into ~/.cache/hicache-bench/sglang), a wheel file, or
a source tree (a checkout's python/, e.g. a pull request's branch). docs/sglang.md says what
runs real and what is a stand-in. Exit 0: every row OK; 1: a count differs, the ranks
disagree or the counts miss torch's sequence numbers; 2: bad input, an SGLang it cannot
drive, or no network (one line on stderr).

With --controller, SGLang's own controller path instead (0.5.19 on, TP2): its
prefetch_from_storage, its controller's hit-query, IO and ack threads with their MINs on the
groups SGLang makes, a HiCacheStorage subclass serving the harness's storage tier, its
drains and poll, for six requests; per request its decision / hit-query / ack collectives
beside the model's (docs/sglang.md, "SGLang's own controller path"). Exit 0: all equal and
the self-checks hold; 1: not; 2: bad input.

With --hazard, the hazard matrix's skew scenario on SGLang's own poll at TP2 (#30760
walk-skew: rank 1's walk polls one pending prefetch fewer in a step; #38273 ongoing-skew:
a prefetch in rank 0's ongoing_prefetch only), one cell per policy, each named as `bench
hazards` names it (OK / deadlock with SGLang's call site, ranks and step / divergence /
abort) with what gloo did. Exit 0: every cell classified (with --twice, alike both times);
1: a cell ran past its bound or differed; 2: bad input.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.report.printer import console_table, fit, fitted_table, say

PROG = "bench sglang-poll"
HAZARD_COLUMNS = ("scenario", "sglang", "policy", "outcome", "step", "poll_collectives",
                  "gloo", "site")
CONTROLLER_COLUMNS = ("request", "policy", "polls", "ended_by", "hit_pages", "sglang d/h/a",
                      "model d/h/a", "ok")
COLUMNS = ("request", "policy", "polls", "sglang_per_poll", "model_per_poll",
           "sglang_per_step", "model_per_step", "ok", "call_sites")


def _parse(argv: list[str]):
    from sglang_adapter import POLICIES

    parser = CliParser.from_doc(PROG, __doc__)
    parser.add_argument("--sglang", required=True, metavar="SPEC",
                        help="a release (0.5.23), a wheel file or a source tree")
    parser.add_argument("--tp", type=int, default=2, help="TP size (default 2)")
    parser.add_argument("--pp", type=int, default=1, help="PP size (default 1)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma-separated, of {', '.join(POLICIES)} (default all)")
    parser.add_argument("--pending-polls", type=int, default=None,
                        help="polls that find each prefetch pending (default 3; 2 with "
                             "--hazard)")
    parser.add_argument("--controller", action="store_true",
                        help="run SGLang's controller path (threads, groups, storage "
                             "backend) at TP2 instead")
    parser.add_argument("--hazard", choices=("walk-skew", "ongoing-skew"),
                        help="run a skew scenario instead of counting (TP2)")
    parser.add_argument("--collective-timeout", type=float, default=4.0,
                        help="--hazard: the TP group's collective timeout, s (default 4)")
    parser.add_argument("--twice", action="store_true",
                        help="--hazard: run every cell twice and compare the outcomes")
    parser.add_argument("--out", default=None,
                        help="--hazard: where the cells' rank reports go (default a new "
                             "results folder)")
    return parser.parse_args(argv)


def _main(argv: list[str]) -> int:
    from bench.sglang_poll.poll import PollOptions, modelled_protocol, run_polls
    from sglang_adapter import load, resolve

    args = _parse(argv)
    if args.controller:
        return _controller_main(args)
    if args.hazard:
        return _hazard_main(args)
    args.pending_polls = 3 if args.pending_polls is None else args.pending_polls
    try:  # checked before SPEC is resolved: bad options never start a download
        opts = PollOptions(None, args.tp, args.pp,
                           tuple(p for p in args.policies.split(",") if p), args.pending_polls)
    except ValueError as e:
        raise UserError(str(e)) from None
    source = resolve(args.sglang)
    opts = replace(opts, source=source, protocol=modelled_protocol(source))
    load(source)  # here, so an SGLang it cannot drive is one line before any rank starts
    rows, ok = run_polls(opts)
    say(f"sglang {source.label} at TP{opts.tp} x PP{opts.pp}, held against "
        f"{opts.protocol}")
    say("\n".join(console_table(list(COLUMNS), [[_cell(r[c]) for c in COLUMNS] for r in rows],
                                 long=("call_sites",), keys=2)))
    say("OK" if ok else "FAILED")
    return 0 if ok else 1


def _cases(args) -> list:
    from bench.hazards.sglang_case import HazardCase

    if args.tp != 2 or args.pp != 1:
        raise UserError("--hazard runs at TP2 x PP1 (its skew is between two TP ranks)")
    pending = 2 if args.pending_polls is None else args.pending_polls
    try:
        return [HazardCase(args.hazard, p, pending, args.collective_timeout)
                for p in args.policies.split(",") if p]
    except ValueError as e:
        raise UserError(str(e)) from None


def _out(args) -> Path:
    from bench.rundir.env import short_sha
    from bench.rundir.rundir import RunDir

    return Path(args.out) if args.out else RunDir.new("run", "sglang-hazards",
                                                      short_sha()).path


def _hazard_main(args) -> int:
    cases = _cases(args)  # checked before SPEC is resolved: no download for bad options
    from bench.hazards.report import exit_code  # torch: only once the options held
    from bench.hazards.sglang import run_hazard
    from sglang_adapter import load, resolve

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
        say(fit(f"{case.scenario} x {source.label} x {case.policy}: {row['outcome']} "
                f"{row['detail'][:300]}"))
    cols = [*HAZARD_COLUMNS, *(("same_twice",) if args.twice else ())]
    say("\n".join(console_table(list(cols), [[str(r[c]) for c in cols] for r in rows],
                                 long=("gloo", "site"), keys=3)))
    # as `bench hazards`: 3 the harness could not run a cell, 1 a hazard that fails the
    # run (a hang past its bound, classified; outcomes that differ under --twice), else 0
    code, word = exit_code(rows, alike, 0)
    say(f"{word} ({len(rows)} cells -> {out})")
    return code


def _cell(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def main(argv: list[str]) -> int:
    from sglang_adapter import LoadError, SourceError

    return run_verb(PROG, _main, argv, bad_input=(UserError, SourceError, LoadError))


def _controller_main(args) -> int:
    if args.hazard or args.tp != 2 or args.pp != 1:
        raise UserError("--controller runs at TP2 x PP1, without --hazard")
    from bench.sglang_poll.controller import run_controller  # torch: once the options held

    # An SGLang it cannot have or drive: SourceError / LoadError, one line (main).
    table, ok, header, r0 = run_controller(args.sglang)
    say(header)
    say("\n".join(fitted_table(list(CONTROLLER_COLUMNS), [[str(v) for v in row]
                                                           for row in table])))
    say(fit(f"pages loaded = storage: {r0['loaded'][1]} of {r0['loaded'][0]}; "
            f"door = torch's sequence numbers: {r0['crosscheck']}"))
    say("OK" if ok else "FAILED")
    return 0 if ok else 1
