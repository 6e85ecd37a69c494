"""`python -m bench hazards`: the protocols x hazard scenarios matrix (docs/hazards.md).

Every cell serves a short burst on fresh ranks (TP 2, or TP 2 x PP 2) with a short
collective timeout and reports one of: OK (with the protocol's cost), deadlock (the first
unpaired or failed collective: call site, ranks, step, each rank's last collectives),
abort (gloo killed a rank on a size mismatch: the collective its peers name, both sizes),
divergence (the first poll the ranks answered differently), corrupt pages. Writes
hazards.csv, hazards.md, hazards.png, env.json and each cell's rank reports. Exit codes:
0 every cell classified (and, with --twice, alike in both runs), 1 a cell ran past its
bound or differed between the runs, 2 bad input.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.commands.common import CliParser, UsageError, add_cache_options, run_verb
from bench.hazards.matrix import MatrixSpec, run_matrix, run_one
from bench.hazards.report import write
from bench.hazards.scenarios import SCENARIOS, check_choice, runs
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
    add_cache_options(a, "its release's protocol, so --protocols is not given")
    a("--sglang-consensus", action="store_true",
      help="with --cache sglang: serve every cell a second time with SGLang's own "
      "rank-consensus checker on, and report what it said (the sglang_consensus column)")
    a("--twice", action="store_true", help="run every cell twice and compare the outcomes")
    a("--out", default="", help="results directory (default results/<UTC>_hazards_<sha>)")
    return p


def _spec(args) -> MatrixSpec:
    protocols = tuple(x for x in (args.protocols or ",".join(PROTOCOLS)).split(",") if x)
    unknown = [x for x in protocols if x not in PROTOCOLS]
    if unknown or not protocols:
        raise UsageError(f"unknown protocol {unknown[0] if unknown else ''!r}; choose from "
                         f"{', '.join(PROTOCOLS)}")
    if args.pp is not None and args.pp < 1:
        raise UsageError(f"--pp must be >= 1, got {args.pp}")
    if not args.collective_timeout > 0:
        raise UsageError(f"--collective-timeout must be > 0, got {args.collective_timeout}")
    try:
        scenarios = check_choice([x for x in args.scenarios.split(",") if x], args.pp)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not scenarios:
        raise UsageError(f"no scenario named; choose from {', '.join(SCENARIOS)}")
    spec = MatrixSpec(protocols, tuple(scenarios), args.seed, args.collective_timeout,
                      Path(args.out) if args.out else _default_out())
    return _system_under_test(spec, args)


def _system_under_test(spec: MatrixSpec, args) -> MatrixSpec:
    """--cache sglang: the release read once here (one line, exit 2, when it cannot be had
    or driven); its cells run the release's model protocol under SGLang's decisions."""
    from sglang_adapter import ChoiceError, choose

    try:
        # SGLang's page-hash extension built first where a cell may take its controller path
        target = choose(args.cache, args.sglang, args.protocols is not None,
                        native=any(s.sglang_controller for s in spec.scenarios))
    except ChoiceError as e:
        raise UsageError(str(e)) from None
    if args.sglang_consensus and target is None:
        raise UsageError("--sglang-consensus runs SGLang's own checker: it needs --cache "
                         "sglang --sglang SPEC")
    return spec if target is None else replace(spec, protocols=(target.protocol,),
                                               sglang=target, consensus=args.sglang_consensus)


def _default_out() -> Path:
    return RunDir.new("run", "hazards", short_sha()).path


def _second_run(spec: MatrixSpec, rows: list[dict]) -> bool:
    """Every cell again with the same seed; whether each outcome repeats."""
    alike = True
    by = {s.name: s for s in spec.scenarios}
    protocol = {spec.label(p): p for p in spec.protocols}  # the column -> what ran it
    for row in rows:
        again = run_one(spec, by[row["scenario"]], protocol[row["protocol"]], tag="__again")
        row["same_twice"] = again["outcome"] == row["outcome"] and \
            again.get("sglang_consensus") == row.get("sglang_consensus")
        alike &= row["same_twice"]
        if not row["same_twice"]:
            print(f"{row['scenario']} x {row['protocol']}: {row['outcome']} then "
                  f"{again['outcome']} ({again['detail'][:120]}); SGLang's checker "
                  f"{row.get('sglang_consensus')} then {again.get('sglang_consensus')}")
    return alike


def _body(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    spec = _spec(args)
    spec.out.mkdir(parents=True, exist_ok=True)
    cells = sum(runs(s, p) for s in spec.scenarios for p in spec.protocols)
    print(f"{PROG}: {cells} cells, collective timeout {spec.timeout_s:g} s, seed {spec.seed}"
          f" -> {spec.out}")
    rows = run_matrix(spec)
    alike = _second_run(spec, rows) if args.twice else True
    env = collect_env("gloo", {"tp": 2, "pp": sorted({s.pp for s in spec.scenarios})})
    write_json_atomic(RunDir(spec.out).file("env"), env)
    header = [f"Commit {((env['git'] or {}).get('commit') or '?')[:10]}"
              f"{' (dirty)' if env['git'] and env['git'].get('dirty') else ''}, "
              f"{env['utc_time']}, host {env['host']}, {env['cpu_count']} CPUs; seed "
              f"{spec.seed}, collective timeout {spec.timeout_s:g} s, gloo, TP 2."]
    write(spec.out, rows, header)
    harness = [r for r in rows if r["outcome"] == "harness"]
    ok = not harness and alike
    print(f"{PROG}: {'OK' if ok else 'FAILED'} ({len(rows)} cells, {len(harness)} past their "
          f"bound{'' if alike else ', outcomes differ between the two runs'}) -> "
          f"{spec.out / 'hazards.md'}")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    return run_verb(PROG, _body, argv)
