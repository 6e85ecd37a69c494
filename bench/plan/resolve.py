"""The plan `bench run`'s options resolve to (bench.plan.options.RunOptions to
bench.run.plan.RunPlan): the preset's values under the flags', every value checked here,
before any rank starts. A bad value is a UserError (bench.errors), one line naming the flag."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from bench import neighbour
from bench.errors import UserError
from bench.plan.options import PAIRINGS, REDO_ENV, REPEAT_SEEDS, RunOptions
from bench.plan.presets import PRESETS
from bench.run import delays, sglang_worlds
from bench.run.plan import ALIASES, PROJECT_PROTOCOLS, TRACE_EXCERPT, Cell, RunPlan
from bench.run.trace import TraceError, TraceSpec
from bench.run.workload import WorkloadSpec
from bench.rundir.env import REPO_DIR
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import POLICIES, PROTOCOLS
from hicache.spec.storage_spec import StorageSpec
from sglang_adapter import ChoiceError, choose_for_run, choose_sides, is_side_list

# The synthetic workload's flags: a trace replay sets these itself
SYNTHETIC_ONLY = ("requests", "rate", "bystanders", "bystander_rate", "output_tokens")


def _list(text: str | None, allowed: tuple[str, ...], what: str, aliases=None) -> tuple:
    if text is None:
        return ()
    items = [(aliases or {}).get(x.strip(), x.strip()) for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise UserError(f"unknown {what} {', '.join(bad) or repr(text)}; choose from "
                        f"{', '.join(allowed)}")
    return tuple(dict.fromkeys(items))


def _positive(name: str, value, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise UserError(f"--{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def build_plan(args: RunOptions) -> RunPlan:
    """The plan the options ask for, every value checked (UserError when one is bad)."""
    from bench.run.gpus import gpus_and_nccl

    gpus = gpus_and_nccl()[0]
    preset = PRESETS[args.preset](gpus if args.device != "cpu" else 0)
    for name in ("requests", "repeats", "tp", "pp", "nproc", "kill_step", "output_tokens",
                 "max_running", "bystander_rate", "storage_gbps"):
        _positive(name.replace("_", "-"), getattr(args, name), allow_zero=name == "kill_step")
    for name in ("storage_latency_ms", "jitter", "stall_ms", "budget_skew", "fail_rate",
                 "bystanders", "land_step", "land_skew_steps"):
        _positive(name.replace("_", "-"), getattr(args, name), allow_zero=True)
    _positive("timeout-base", args.timeout_base, allow_zero=True)
    _positive("step-ms", args.step_ms, allow_zero=True)
    _positive("collective-timeout", args.collective_timeout)
    _positive("kv-budget-gib", args.kv_budget_gib)
    tp, pp = args.tp or preset.get("tp", 2), args.pp or preset.get("pp", 1)
    world = tp * pp
    if args.nproc is not None and args.nproc != world:
        raise UserError(f"--nproc {args.nproc} does not match --tp {tp} x --pp {pp} = {world}")
    if args.kill_rank is not None and not 0 <= args.kill_rank < world:
        raise UserError(f"--kill-rank {args.kill_rank} is not a rank of a {world}-rank run")
    rates = preset.get("rates", (16.0,))
    if args.rate is not None:
        _positive("rate", args.rate)
        rates = (args.rate,)
    trace, offered, tiers = trace_settings(args, preset)
    storage = _storage(args, preset)
    system = {**tiers, **_system(args, preset)}
    protocols = _list(args.protocols, PROTOCOLS, "protocol", ALIASES) or \
        preset.get("protocols", PROJECT_PROTOCOLS)
    policies = _list(args.policies, POLICIES, "policy") or preset.get("policies", POLICIES)
    plan = RunPlan(preset=args.preset, protocols=tuple(protocols), policies=tuple(policies),
                   rates=tuple(offered or rates),
                   repeats=args.repeats or preset.get("repeats", 3),
                   **_staging(args, preset), tp=tp, pp=pp, seed=args.seed,
                   repeat_seeds=_repeat_seeds(args.repeat_seeds, preset),
                   redo_disturbed=_redo(args.redo_disturbed, preset),
                   model=args.model or "llama3-8b", gpu=args.gpu or "h100", step_ms=args.step_ms,
                   workload=_workload(args, preset), trace=trace, storage=storage,
                   system=tuple(sorted(system.items())),
                   neighbour=_neighbour(args.neighbour), pairing=_pairing(args.pairing),
                   host_work=_host_work(args.host_work, preset.get("host_work"), args))
    try:
        plan = delays.apply(plan, delays.parse(args.collective_delay_ms)
                            or preset.get("delays_ms", ()))
    except ValueError as e:
        raise UserError(str(e)) from None
    plan = _system_under_test(plan, args, preset.get("sglang"))
    if args.model_beside or preset.get("model_beside"):
        try:
            plan = sglang_worlds.with_model(plan)
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.schedule is None:
        plan = _pin_if_possible(plan)
    if plan.resolve and plan.delays_ms:
        raise UserError("--resolve stages one run's protocols; a cost sweep "
                        "(--collective-delay-ms MS,MS,...) serves a fixed number of repeats")
    if args.redo_disturbed and plan.schedule != "pinned":
        raise UserError("--redo-disturbed needs a pinned schedule (a free one would serve "
                        "another schedule the second time)")
    if plan.host_work and plan.schedule != "pinned":
        raise UserError("--host-work needs --schedule pinned: on a free schedule the "
                        "decisions, and so the work counted, vary with timing")
    if plan.pairing and plan.redo_disturbed:
        # Duet: a serve run again alone would not be paired in time with its partner's;
        # step: a burst lands on both sides of a step, so a disturbed serve needs no redo.
        plan = replace(plan, redo_disturbed=None)
    _check_configs(plan)
    return plan


def _system_under_test(plan: RunPlan, args: RunOptions, preset_sides: str | None = None
                       ) -> RunPlan:
    """--cache sglang: SGLang's code behind the seam (sglang_adapter.target), read once;
    several SGLangs (a list, or a label): a side each, its name a protocol
    (sglang_adapter.side_specs; one labelled SGLang: a run of one under its label). A preset's
    sides (seed-pr, whose system under test is SGLang) serve unless --sglang names others."""
    given = (args.protocols is not None, bool(plan.pairing))
    if preset_sides:
        args = replace(args, cache="sglang", sglang=args.sglang or preset_sides)
    try:
        if args.cache == "sglang" and is_side_list(args.sglang):
            sides = choose_sides(args.sglang, *given, args.sglang_path, plan.pp,
                                 dict(plan.system))
            return replace(plan, sides=sides if len(sides) > 1 else (), sglang=sides[0],
                           protocols=tuple(t.name for t in sides))
        target = choose_for_run(args.cache, args.sglang, *given, args.sglang_path, plan.pp,
                                dict(plan.system))
    except ChoiceError as e:
        raise UserError(str(e)) from None
    if args.sglang_consensus and target is None:
        raise UserError("--sglang-consensus runs SGLang's own checker: it needs --cache "
                        "sglang --sglang SPEC")
    return plan if target is None else replace(plan, sglang=target, protocols=(target.name,))


def _host_work(flag: str | None, preset: str | None, args: RunOptions) -> str | None:
    """--host-work's mode (bench.run.host_profile), else the preset's where it can count: a
    count needs the pinned schedule (the same decisions every run) and the serial design (a
    serve per cell); asked for where it cannot, a UserError."""
    mode = flag or preset
    if mode is None or mode == "none":
        return None
    if mode not in ("calls", "opcodes"):
        raise UserError(f"--host-work must be calls, opcodes or none, got {mode!r}")
    why = (f"--pairing {args.pairing}" if args.pairing not in (None, "serial") else
           "--schedule free" if args.schedule == "free" else None)
    if why and flag:
        raise UserError(f"--host-work counts serial serves on a pinned schedule, not {why}")
    return None if why else mode


def _neighbour(text: str | None) -> str | None:
    """The neighbour's canonical spec text, or None for none (UserError when bad)."""
    try:
        spec = neighbour.parse(text)
    except neighbour.SpecError as e:
        raise UserError(str(e)) from None
    return None if spec is None else spec.text


def _pairing(text: str | None) -> str | None:
    """None for the serial design (interleaved whole serves), else a PAIRINGS name."""
    if text is None or text == "serial":
        return None
    if text not in PAIRINGS:
        raise UserError(f"--pairing must be one of serial, {', '.join(PAIRINGS)}, got "
                        f"{text!r}")
    return text


def _plant(text: str) -> tuple[str, str, float]:
    """--plant PROTOCOL:MS as (protocol, "planted_step_ms", ms), or PROTOCOL:Ncalls (host
    work, not time: hicache.cache.twin._work) as (protocol, "planted_step_calls", N)."""
    proto, _, size = text.partition(":")
    proto = ALIASES.get(proto.strip(), proto.strip())
    calls = size.strip().endswith("calls")
    try:
        value = int(size.strip()[:-5]) if calls else float(size)
    except ValueError:
        value = -1
    if proto not in PROTOCOLS or not value > 0:
        raise UserError(f"--plant takes PROTOCOL:MS or PROTOCOL:Ncalls (a protocol of "
                        f"{', '.join(PROTOCOLS)} and MS or N > 0), got {text!r}")
    return proto, "planted_step_calls" if calls else "planted_step_ms", value


def _staging(args: RunOptions, preset: dict) -> dict:
    """--resolve and its budget: the flag's, else the preset's unless --repeats alone asks
    for a fixed number of repeats; 0 turns staging off."""
    _positive("budget-s", args.budget_s)
    _positive("budget-repeats", args.budget_repeats)
    if args.resolve is not None and not 0 <= args.resolve < 1:
        raise UserError(f"--resolve must lie in [0, 1) (a half-width: 0.03 is 3%), "
                        f"got {args.resolve}")
    target = args.resolve if args.resolve is not None else \
        (None if args.repeats else preset.get("resolve"))
    if not target:
        if args.budget_s is not None or args.budget_repeats is not None:
            raise UserError("--budget-s and --budget-repeats bound a staged run: they need "
                            "--resolve F")
        return {"resolve": None}
    out = {"resolve": target, "budget_s": args.budget_s or preset.get("budget_s", 300.0),
           "budget_repeats": args.budget_repeats or preset.get("budget_repeats", 96)}
    first = args.repeats or preset.get("repeats", 3)
    if out["budget_repeats"] < first:
        raise UserError(f"--budget-repeats {out['budget_repeats']} is below the first "
                        f"stage's {first} repeats")
    return out


def _repeat_seeds(flag: str | None, preset: dict) -> str | None:
    """same, or None for distinct (the plan before the option existed)."""
    value = flag or preset.get("repeat_seeds") or "distinct"
    if value not in REPEAT_SEEDS:
        raise UserError(f"--repeat-seeds must be one of {', '.join(REPEAT_SEEDS)}, got "
                        f"{value!r}")
    return None if value == "distinct" else value


def _redo(flag: int | None, preset: dict) -> int | None:
    """Serves again for a disturbed cell: the flag's, else REDO_ENV's, else the preset's;
    0 is None."""
    env = os.environ.get(REDO_ENV, "")
    if flag is None and env.strip().isdigit():
        flag = int(env)
    value = preset.get("redo_disturbed") if flag is None else flag
    if value is not None and value < 0:
        raise UserError(f"--redo-disturbed must be >= 0, got {value}")
    return value or None


def _pin_if_possible(plan: RunPlan) -> RunPlan:
    """A preset's pinned schedule, or free where the flags asked for what a pinned one
    cannot pin (e.g. --gpu none, a write path, a side-car pool); an explicit --schedule
    pinned is refused for those instead (one line, exit 2)."""
    if plan.schedule != "pinned":
        return plan
    try:
        _check_configs(plan)
        return plan
    except UserError:
        system = {**dict(plan.system), "schedule": "free"}
        return replace(plan, system=tuple(sorted(system.items())))


def _check_configs(plan: RunPlan) -> None:
    """Every protocol x policy's system configuration is valid (e.g. buffer_only host
    memory for a protocol whose releases have none), before any rank starts."""
    for proto in plan.protocols:
        for policy in plan.policies:
            try:
                plan.config(Cell(0, 0, plan.rates[0], policy, proto))
            except ValueError as e:
                raise UserError(str(e)) from None


def _workload(args, preset: dict) -> WorkloadSpec:
    def pick(flag: str, key: str, default):
        value = getattr(args, flag)
        return preset.get(key, default) if value is None else value

    return WorkloadSpec(requests=pick("requests", "requests", 32),
                        bystanders=pick("bystanders", "bystanders", 0),
                        bystander_rate_rps=pick("bystander_rate", "bystander_rate", 20.0),
                        output_tokens=pick("output_tokens", "output_tokens", 64),
                        request_tokens=preset.get("request_tokens", 256))


def _storage(args, preset: dict) -> StorageSpec:
    kw = {"kind": args.storage, "latency_ms": 2.0, "bandwidth_gbps": 3.0,
          "sidecar_page_ms": preset.get("sidecar_page_ms", 0.0)}
    for flag, key in (("storage_latency_ms", "latency_ms"), ("storage_gbps", "bandwidth_gbps"),
                      ("jitter", "jitter"),
                      ("fail_rate", "fail_rate"), ("stall_ms", "stall_ms")):
        if getattr(args, flag) is not None:
            kw[key] = getattr(args, flag)
    try:
        root = str(REPO_DIR / "results" / ".storage")
        return StorageSpec(**kw, root=root if args.storage == "file"
                           else None)
    except ValueError as e:
        raise UserError(str(e)) from None


def _system(args, preset: dict) -> dict:
    s = {}
    if args.extra_pool or preset.get("extra_pool"):
        s["extra_pool"] = True
    host_memory = args.host_memory or preset.get("host_memory")
    if host_memory is not None:
        s["host_memory"] = host_memory
    if args.no_race_guard:
        s["race_guard"] = False
    for flag, key in (("budget_skew", "budget_skew"), ("timeout_base", "timeout_base_s"),
                      ("land_step", "land_step"), ("land_skew_steps", "land_skew_steps"),
                      ("max_running", "max_running_requests"),
                      ("collective_timeout", "collective_timeout_s"),
                      ("kill_rank", "kill_rank"), ("kill_step", "kill_step")):
        if getattr(args, flag) is not None:
            s[key] = getattr(args, flag)
    if args.consensus:
        s["consensus_check"] = True
    if args.plant is not None:
        s["planted_protocol"], key, s[key] = _plant(args.plant)
    if args.timeline:
        s["timeline"] = True
    s["schedule"] = args.schedule or preset.get("schedule", "free")
    if args.kv_budget_gib is not None:
        s["kv_budget_gib"] = args.kv_budget_gib
    if args.budget_skew is not None and not args.budget_skew < 1:
        raise UserError(f"--budget-skew must be < 1, got {args.budget_skew}")
    return s



def trace_settings(args, preset: dict) -> tuple[TraceSpec | None, tuple | None, dict]:
    """(trace window or None, offered rates or None = the synthetic ones, HiCacheConfig
    overrides for the tiers)."""
    kind = args.workload or ("trace" if args.trace or "trace" in preset else "synthetic")
    if kind == "synthetic":
        for flag in ("trace", "trace_skip", "trace_requests", "time_scale"):
            if getattr(args, flag) is not None:
                raise UserError(f"--{flag.replace('_', '-')} needs --workload trace")
        if args.unbounded_pools:
            raise UserError("--unbounded-pools needs --workload trace (pools sized to it)")
        return None, None, _tiers(args, args.write_policy or "none", preset)
    for flag in SYNTHETIC_ONLY:
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag.replace('_', '-')} sets the synthetic workload; a "
                            f"trace sets its own (--trace-requests, --time-scale)")
    spec = _spec(args, preset)
    scales = _scales(args.time_scale, preset.get("time_scales", (1.0,)))
    base = spec.base_rate_rps()
    if not math.isfinite(base):
        raise UserError(f"{spec.path}: the replayed requests all arrive at once; a time scale "
                        f"needs arrivals spread in time")
    system = _tiers(args, args.write_policy or preset.get("write_policy", "write_through"),
                    preset)
    if args.unbounded_pools:
        system.update(_unbounded(spec, system))
    return spec, tuple(s * base for s in scales), system


def _spec(args, preset: dict) -> TraceSpec:
    path = args.trace or Path(preset.get("trace", TRACE_EXCERPT))
    skip = preset.get("trace_skip", 0) if args.trace_skip is None else args.trace_skip
    limit = preset.get("trace_requests") if args.trace_requests is None else args.trace_requests
    if skip < 0:
        raise UserError(f"--trace-skip must be >= 0, got {skip}")
    if limit is not None and limit < 1:
        raise UserError(f"--trace-requests must be >= 1, got {limit}")
    spec = TraceSpec(str(path), skip, limit)
    try:
        spec.rows()  # read and validated once here; the ranks read the same file
    except TraceError as e:
        raise UserError(str(e)) from None
    return spec


def _scales(text: str | None, default: tuple) -> tuple[float, ...]:
    if text is None:
        return tuple(default)
    try:
        scales = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--time-scale takes numbers, e.g. 1,2,4,8; got {text!r}") from None
    if not scales or not all(math.isfinite(s) and s > 0 for s in scales):
        raise UserError(f"--time-scale values must be finite and > 0, got {text!r}")
    return tuple(dict.fromkeys(scales))


def _tiers(args, policy: str, preset: dict) -> dict:
    # Off (the synthetic presets' default) adds nothing, so their plans read as before.
    out = {} if policy == "none" else {"write_policy": policy}
    if args.allow_auto_truncate:
        out["allow_auto_truncate"] = True
    if args.page_size is not None:
        if args.page_size < 1:
            raise UserError(f"--page-size must be >= 1, got {args.page_size}")
        out["page_size"] = args.page_size
    if policy != "none" and "kv_budget_gib" in preset:
        out["kv_budget_gib"] = preset["kv_budget_gib"]
    return out


def _unbounded(spec: TraceSpec, system: dict) -> dict:
    if system.get("write_policy", "none") == "none":
        raise UserError("--unbounded-pools needs a write policy (the device tier)")
    rows, page = spec.rows()[spec.skip:], system.get("page_size", HiCacheConfig().page_size)
    pages = sum(r.input_length // page + 1 for r in rows)  # every page the replay can hold
    return {"unbounded_pools": True, "device_pool_pages": pages, "host_pool_pages": pages,
            "kv_bytes": "synthetic"}
