"""`python -m bench hazards`: the protocols x hazard scenarios matrix (docs/hazards.md).

Every cell serves a short burst on fresh ranks (TP 2, or TP 2 x PP 2) with a short
collective timeout and reports one of: OK (with the protocol's cost), deadlock (the first
unpaired or failed collective: call site, ranks, step, each rank's last collectives),
abort (gloo killed a rank on a size mismatch: the collective its peers name, both sizes),
divergence (the first poll the ranks answered differently), corrupt pages; a cell whose
ranks ran past its bound: livelock (stepping without progress: the step it began, the
cycle that repeats) or deadlock (a rank waiting outside any collective), harness only where
the harness could not run it (bench.hazards.hang). Writes
hazards.csv, hazards.md, hazards.png, env.json and each cell's rank reports. With
`--cache sglang --sglang base=SPEC,head=SPEC` every cell runs on every side (a row per
cell per side, the side in the protocol column), and the cells that changed from the first
side are named first. Exit codes: 0 every cell classified within its bound (and, with
--twice, alike in both runs); 1 a hazard that fails the run: a cell hung past its bound (a
livelock or a deadlock outside any collective), differed between the runs, or (sides) got
worse than the first side's; 2 bad input; 3 the harness failed: a cell it could not run
(a start-up that failed or ran past its bound, ranks still progressing at the bound).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.commands.common import CliParser, add_cache_options, run_verb
from bench.errors import UserError
from bench.hazards.matrix import MatrixSpec, refusal, run_matrix, run_one, run_sides
from bench.hazards.report import exit_code, past_bound, write
from bench.hazards.scenarios import SCENARIOS, check_choice, runs
from bench.hazards.side_changes import summary_lines, worse
from bench.report.printer import fit, say
from bench.rundir.env import collect_env, short_sha
from bench.rundir.files import write_json_atomic
from bench.rundir.rundir import RunDir
from hicache.spec.cost_model import PROTOCOLS

PROG = "bench hazards"


def parser() -> CliParser:
    p = CliParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--protocols", help="comma-separated (default: all)")
    a("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated of {', '.join(SCENARIOS)}")
    a("--seed", type=int, default=0, help="storage noise seed (the workload is fixed)")
    a("--collective-timeout", type=float, default=2.0, help="seconds, every system group")
    a("--pp", type=int, default=None, help="pin the layout's PP size (scenarios needing more: "
                                            "bad input)")
    add_cache_options(a, "its release's protocol, so --protocols is not given", several=True)
    a("--sglang-consensus", action="store_true",
      help="with --cache sglang: serve every cell a second time with SGLang's own "
      "rank-consensus checker on, and report what it said (the sglang_consensus column)")
    a("--twice", action="store_true", help="run every cell twice and compare the outcomes")
    a("--out", default="", help="results directory (default results/<UTC>_hazards_<sha>)")
    return p


def _specs(args) -> list[MatrixSpec]:
    protocols = tuple(x for x in (args.protocols or ",".join(PROTOCOLS)).split(",") if x)
    unknown = [x for x in protocols if x not in PROTOCOLS]
    if unknown or not protocols:
        raise UserError(f"unknown protocol {unknown[0] if unknown else ''!r}; choose from "
                        f"{', '.join(PROTOCOLS)}")
    if args.pp is not None and args.pp < 1:
        raise UserError(f"--pp must be >= 1, got {args.pp}")
    if not args.collective_timeout > 0:
        raise UserError(f"--collective-timeout must be > 0, got {args.collective_timeout}")
    try:
        scenarios = check_choice([x for x in args.scenarios.split(",") if x], args.pp)
    except ValueError as e:
        raise UserError(str(e)) from None
    if not scenarios:
        raise UserError(f"no scenario named; choose from {', '.join(SCENARIOS)}")
    spec = MatrixSpec(protocols, tuple(scenarios), args.seed, args.collective_timeout,
                      Path(args.out) if args.out else _default_out())
    return _system_under_test(spec, args)


def _system_under_test(spec: MatrixSpec, args) -> list[MatrixSpec]:
    """--cache sglang: each release read once here, then taken out of this process again
    (one line, exit 2, when it cannot be had or driven); its cells run the release's model
    protocol under SGLang's decisions. Several (`base=SPEC,head=SPEC`): a spec a side."""
    from sglang_adapter import ChoiceError, choose, choose_sides, is_side_list

    several = args.cache == "sglang" and is_side_list(args.sglang)
    try:
        # SGLang's page-hash extension built first where a cell may take its controller path
        # (matrix.sglang_path); every other cell runs SGLang's decisions on the project's
        native = any(s.sglang_controller for s in spec.scenarios)
        targets = [replace(t, controller=False) for t in choose_sides(
            args.sglang, args.protocols is not None, False, None if native else "decisions",
            1, {})] if several else \
            [choose(args.cache, args.sglang, args.protocols is not None, native=native)]
    except ChoiceError as e:
        raise UserError(str(e)) from None
    if args.sglang_consensus and targets[0] is None:
        raise UserError("--sglang-consensus runs SGLang's own checker: it needs --cache "
                        "sglang --sglang SPEC")
    return [spec if t is None else replace(spec, protocols=(t.protocol,), sglang=t,
                                           consensus=args.sglang_consensus) for t in targets]


def spec_sides(specs: list[MatrixSpec]) -> bool:
    """Whether the run is of SGLang sides (a list or a label), not one SGLang or protocols."""
    return len(specs) > 1 or (specs[0].sglang is not None and specs[0].sglang.side is not None)


def _default_out() -> Path:
    return RunDir.new("run", "hazards", short_sha()).path


def _second_run(specs: list[MatrixSpec], rows: list[dict]) -> bool:
    """Every cell again with the same seed; whether each outcome repeats."""
    alike = True
    by = {s.name: s for s in specs[0].scenarios}
    cells = {spec.label(p): (spec, p) for spec in specs for p in spec.protocols}
    for row in rows:
        spec, protocol = cells[row["protocol"]]
        again = run_one(spec, by[row["scenario"]], protocol, tag="__again")
        row["same_twice"] = again["outcome"] == row["outcome"] and \
            again.get("sglang_consensus") == row.get("sglang_consensus")
        alike &= row["same_twice"]
        if not row["same_twice"]:
            say(fit(f"{row['scenario']} x {row['protocol']}: {row['outcome']} then "
                    f"{again['outcome']} ({again['detail'][:120]}); SGLang's checker "
                    f"{row.get('sglang_consensus')} then {again.get('sglang_consensus')}"))
    return alike


def _header(env: dict, specs: list[MatrixSpec], sides: bool) -> list[str]:
    spec = specs[0]
    named = "; ".join(f"{one.sglang.name} from {one.sglang.root}" for one in specs if sides)
    where = [f"Sides, the first the reference: {named} (each cell's ranks import their own "
             "side's SGLang)."] if sides else []
    return [f"Commit {((env['git'] or {}).get('commit') or '?')[:10]}"
            f"{' (dirty)' if env['git'] and env['git'].get('dirty') else ''}, "
            f"{env['utc_time']}, host {env['host']}, {env['cpu_count']} CPUs; seed "
            f"{spec.seed}, collective timeout {spec.timeout_s:g} s, gloo, TP 2.", *where]


def _body(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    specs = _specs(args)
    spec, sides = specs[0], spec_sides(specs)
    spec.out.mkdir(parents=True, exist_ok=True)
    cells = sum(runs(s, p, one.sglang is not None) for s in spec.scenarios for one in specs
                for p in one.protocols)
    say(fit(f"{PROG}: {cells} cells, collective timeout {spec.timeout_s:g} s, seed "
            f"{spec.seed}{f', {len(specs)} sides' if sides else ''} -> {spec.out}"))
    for one in specs:  # refused before anything serves, a line each
        for s in spec.scenarios:
            why = refusal(one.sglang, s)
            if why and any(runs(s, p, one.sglang is not None) for p in one.protocols):
                say(fit(f"{PROG}: refused: {s.name} on {one.label(one.protocols[0])}: {why}"))
    rows = run_sides(specs) if sides else run_matrix(spec)
    alike = _second_run(specs, rows) if args.twice else True
    env = collect_env("gloo", {"tp": 2, "pp": sorted({s.pp for s in spec.scenarios})})
    write_json_atomic(RunDir(spec.out).file("env"), env)
    write(spec.out, rows, _header(env, specs, sides), sides, spec.consensus)
    lost = worse(rows, spec.consensus) if sides else []
    if sides:
        say(fit(*summary_lines(rows, spec.consensus)))
    code, words = exit_code(rows, alike, len(lost))
    worse_note = f", {len(lost)} worse than {specs[0].label(spec.protocols[0])}" if lost else ""
    say(fit(f"wrote {spec.out / 'hazards.md'}"))
    say(fit(f"{PROG}: {words} ({len(rows)} cells, {past_bound(rows)} past their bound"
            f"{'' if alike else ', outcomes differ between the two runs'}{worse_note})"))
    return code


def main(argv: list[str]) -> int:
    return run_verb(PROG, _body, argv)
