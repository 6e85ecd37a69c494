"""`bench run`'s workload and cache-tier flags: a trace replay (bench.run.trace) instead of the
synthetic workload, its window and load, and the device tier's write path (hicache.tiers).
Validated here, before any rank starts; a bad trace file is one line naming its line."""

from __future__ import annotations

import math
from pathlib import Path

from bench.commands.common import UsageError
from bench.run.plan import TRACE_EXCERPT
from bench.run.trace import TraceError, TraceSpec
from hicache.config import WRITE_POLICIES, HiCacheConfig

SYNTHETIC_ONLY = ("requests", "rate", "bystanders", "bystander_rate", "output_tokens")


def add_flags(a) -> None:
    a("--workload", choices=("synthetic", "trace"),
      help="synthetic (the queue/multi-turn workload) or trace (a Mooncake-format file; "
      "default for the trace presets)")
    a("--trace", type=Path, help="trace file for --workload trace (default: the shipped "
      "excerpt, traces/mooncake_conversation_400.jsonl); implies --workload trace")
    a("--trace-skip", type=int, help="first K requests are not replayed: served before the "
      "run, so their pages are in storage (trace preset: 300)")
    a("--trace-requests", type=int, help="requests replayed after the skipped ones "
      "(default: the rest of the file; trace preset: 40)")
    a("--time-scale", help="arrivals X times faster than the trace's; a comma list sweeps "
      "the offered load, e.g. 1,2,4,8")
    a("--write-policy", choices=WRITE_POLICIES, help="the device tier and write path: "
      "write_through (SGLang's default; on for traces), write_back, none (the synthetic "
      "presets: computed pages are not kept)")
    a("--page-size", type=int, help="tokens per KV page (64: a trace block is 8 pages)")
    a("--unbounded-pools", action="store_true", help="device and host pools hold the whole "
      "replay, nothing is evicted (a check: reuse then equals the trace's own bound)")
    a("--allow-auto-truncate", action="store_true", help="a prompt longer than the device "
      "KV pool holds is cut to the longest that fits (SGLang's flag), not refused")


def trace_settings(args, preset: dict) -> tuple[TraceSpec | None, tuple | None, dict]:
    """(trace window or None, offered rates or None = the synthetic ones, HiCacheConfig
    overrides for the tiers)."""
    kind = args.workload or ("trace" if args.trace or "trace" in preset else "synthetic")
    if kind == "synthetic":
        for flag in ("trace", "trace_skip", "trace_requests", "time_scale"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --workload trace")
        if args.unbounded_pools:
            raise UsageError("--unbounded-pools needs --workload trace (pools sized to it)")
        return None, None, _tiers(args, args.write_policy or "none", preset)
    for flag in SYNTHETIC_ONLY:
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} sets the synthetic workload; a "
                             f"trace sets its own (--trace-requests, --time-scale)")
    spec = _spec(args, preset)
    scales = _scales(args.time_scale, preset.get("time_scales", (1.0,)))
    base = spec.base_rate_rps()
    if not math.isfinite(base):
        raise UsageError(f"{spec.path}: the replayed requests all arrive at once; a time scale "
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
        raise UsageError(f"--trace-skip must be >= 0, got {skip}")
    if limit is not None and limit < 1:
        raise UsageError(f"--trace-requests must be >= 1, got {limit}")
    spec = TraceSpec(str(path), skip, limit)
    try:
        spec.rows()  # read and validated once here; the ranks read the same file
    except TraceError as e:
        raise UsageError(str(e)) from None
    return spec


def _scales(text: str | None, default: tuple) -> tuple[float, ...]:
    if text is None:
        return tuple(default)
    try:
        scales = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--time-scale takes numbers, e.g. 1,2,4,8; got {text!r}") from None
    if not scales or not all(math.isfinite(s) and s > 0 for s in scales):
        raise UsageError(f"--time-scale values must be finite and > 0, got {text!r}")
    return tuple(dict.fromkeys(scales))


def _tiers(args, policy: str, preset: dict) -> dict:
    # Off (the synthetic presets' default) adds nothing, so their plans read as before.
    out = {} if policy == "none" else {"write_policy": policy}
    if args.allow_auto_truncate:
        out["allow_auto_truncate"] = True
    if args.page_size is not None:
        if args.page_size < 1:
            raise UsageError(f"--page-size must be >= 1, got {args.page_size}")
        out["page_size"] = args.page_size
    if policy != "none" and "kv_budget_gib" in preset:
        out["kv_budget_gib"] = preset["kv_budget_gib"]
    return out


def _unbounded(spec: TraceSpec, system: dict) -> dict:
    if system.get("write_policy", "none") == "none":
        raise UsageError("--unbounded-pools needs a write policy (the device tier)")
    rows, page = spec.rows()[spec.skip:], system.get("page_size", HiCacheConfig().page_size)
    pages = sum(r.input_length // page + 1 for r in rows)  # every page the replay can hold
    return {"unbounded_pools": True, "device_pool_pages": pages, "host_pool_pages": pages,
            "kv_bytes": "synthetic"}
