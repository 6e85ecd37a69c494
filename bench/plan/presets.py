"""The named presets of `bench run`: small functions returning the plan fields they set
(bench.run.plan.RunPlan), which the command line's flags override (bench.plan.options), and
each one's line of --help."""

from __future__ import annotations

import math

from bench.run.plan import PROJECT_PROTOCOLS, TRACE_EXCERPT
from hicache.spec.cost_model import POLICIES


def _tp(gpus: int) -> int:
    return min(gpus, 8) if gpus > 1 else 2


def _queue(gpus: int) -> dict:
    """docs/design.md section 8's regime: a burst of prefetching requests whose storage
    reads queue up behind one IO thread, polled every step while bystanders decode beside
    them. Six repeats: the unit an interval replicates over (docs/metrics.md, "Intervals")."""
    return {"tp": _tp(gpus), "repeats": 6, "requests": 48, "rates": (math.inf,),
            "bystanders": 48, "bystander_rate": 24.0,
            "protocols": ("pr27010", "pr36425", "step-clock"),
            "policies": ("wait_complete", "timeout"), "schedule": "pinned",
            "repeat_seeds": "same", "redo_disturbed": 1}


# make bench's stages: 12 repeats, then more until the headline's p50 ratios each resolve
# 3 % or 300 s of stages are spent (bench.ab.protocols)
STAGED = {"resolve": 0.03, "budget_s": 300.0, "budget_repeats": 96}
FIXED = {"resolve": None}  # a preset built on the default's that serves its repeats, once


def _default(gpus: int) -> dict:
    """make bench: the end-to-end headline (docs/metrics.md, "The headline and the cost
    decomposition"). What a server sees: the free schedule, IO on the wall clock, so a slower
    poll reshapes the schedule as it would in SGLang. Before (pr27010), after (pr36425) and
    the best collective-free one (step-clock) under the two policies whose polls differ in
    kind; every repeat replays one seed and the protocols of a repeat serve back to back
    (their order rotated per repeat), so each ratio pairs serves close in time."""
    return {**_queue(gpus), "repeats": 12, "requests": 24, "bystanders": 24,
            "protocols": ("pr27010", "pr36425", "step-clock"), "schedule": "free",
            "redo_disturbed": None, **STAGED}


def _cost(gpus: int) -> dict:
    """The cost decomposition: every protocol and policy on one pinned schedule per seed, so
    a difference is the protocol's host cost per step and per poll (never a TTFT or ITL
    effect: docs/design.md, Pinned schedules). The gate's A/B runs this shape."""
    return {**_queue(gpus), "repeats": 6, "requests": 24, "bystanders": 24,
            "protocols": PROJECT_PROTOCOLS, "policies": POLICIES}


def _ci(gpus: int) -> dict:
    """The gate's counts run: every protocol and policy once. Its timings come from `bench
    gate --ab`, which runs repeats of its own."""
    return {**_queue(gpus), "tp": 2, "repeats": 1, "requests": 24, "bystanders": 24,
            "protocols": PROJECT_PROTOCOLS, "policies": POLICIES, "repeat_seeds": None,
            "redo_disturbed": None}


def _sweep(gpus: int) -> dict:
    return {"tp": _tp(gpus), "repeats": 2, "requests": 16,
            "protocols": ("pr27010", "pr36425", "step-clock"),
            "policies": ("wait_complete", "timeout"), "rates": (4.0, 8.0, 16.0, 32.0)}


def _delay_sweep(gpus: int) -> dict:
    """The cost sweep: make bench's workload (the default preset: a burst of 24
    prefetching requests and 24 bystanders, free schedule, one seed) at five added costs per
    control-plane collective, native and +0.5, +1, +2, +3 ms, interleaved in every repeat;
    pr27010 (every poll all-reduces under wait_complete) against pr36425 (none), under
    wait_complete and timeout (where both pay it). Each cost's ratios pair serves of one
    repeat (bench.analysis.sweep)."""
    return {**_default(gpus), "protocols": ("pr27010", "pr36425"),
            "delays_ms": (0.0, 0.5, 1.0, 2.0, 3.0), "repeats": 12, **FIXED}


def _pp(gpus: int) -> dict:
    return {"tp": 2, "pp": 2, "repeats": 2, "requests": 16}


def _trace(gpus: int) -> dict:
    """The shipped excerpt, 300 requests served before (in storage), 32 replayed twice as
    fast as they arrived, every tier on (write-through, SGLang's default): pr27010 and
    pr36425 under wait_complete and timeout, 3 repeats (the fewest an interval needs) in
    about 5 minutes on 2 cores. The budget holds the longest prompt (121k tokens) on the
    device, and about 14 average ones."""
    return {"tp": _tp(gpus), "repeats": 3, "trace": str(TRACE_EXCERPT), "trace_skip": 300,
            "trace_requests": 32, "time_scales": (2.0,), "write_policy": "write_through",
            "kv_budget_gib": 12.0, "protocols": ("pr27010", "pr36425"),
            "policies": ("wait_complete", "timeout")}


def _trace_sweep(gpus: int) -> dict:
    """The load sweep: the trace preset's excerpt, 40 requests at 1, 2, 4 and 8 times their
    own rate, three protocols under timeout, 2 repeats (points only: about 11 minutes)."""
    return {**_trace(gpus), "trace_requests": 40, "time_scales": (1.0, 2.0, 4.0, 8.0),
            "repeats": 2, "protocols": ("pr27010", "pr36425", "step-clock"),
            "policies": ("timeout",)}


def _releases(gpus: int) -> dict:
    """The releases at TP2 x PP2 with buffer_only host memory: there 0.5.23 takes the
    PP-ticket path, whose polls all-reduce under wait_complete, where 0.5.19 (pr36425)
    polls for free; pr27010 is the reference every ratio is taken against."""
    return {**_queue(gpus), "tp": 2, "pp": 2, "repeats": 5, "requests": 24,
            "bystanders": 24, "host_memory": "buffer_only", "policies": ("wait_complete",),
            "protocols": ("pr27010", "pr36425", "sglang-0.5.23")}


def _seed_pr(gpus: int) -> dict:
    """The seed PR as SGLang shipped it: 0.5.18's HiRadixCache poll against 0.5.19's
    UnifiedRadixCache poll (both on SGLang's decisions path: 0.5.18 has no controller path
    here), and beside them in the same turns the project's model of each (pre27010,
    pr36425): make bench's burst (24 + 24) on the free schedule, one seed, the two policies whose
    polls differ, 10 repeats (docs/sglang.md, "The seed PR as released")."""
    return {**_default(gpus), "repeats": 10, "sglang": "before=0.5.18,after=0.5.19",
            "model_beside": True, **FIXED}


def _lag(gpus: int) -> dict:
    """SGLang #32724's regime: a burst whose head fills the prefill budget (1536 new tokens a
    request against 4096 a step: two a prefill) while its prefetches finish far sooner, so
    a request waits between IO done and scheduled. pr36425 against pr32725, pr27010 the
    reference, under timeout, 5 repeats (run it with fast storage: --storage-gbps 20)."""
    return {"tp": 2, "repeats": 5, "requests": 24, "rates": (math.inf,), "bystanders": 0,
            "request_tokens": 1536, "protocols": ("pr27010", "pr36425", "pr32725"),
            "policies": ("timeout",)}


def _race(gpus: int) -> dict:
    return {"tp": 2, "repeats": 1, "requests": 12, "protocols": ("pre27010", "pr36425"),
            "policies": ("wait_complete",), "extra_pool": True,
            "sidecar_page_ms": 5.0}


PRESETS = {"default": _default, "cost": _cost, "queue": _queue, "ci": _ci, "sweep": _sweep,
           "pp": _pp, "race": _race, "releases": _releases, "lag": _lag, "trace": _trace,
           "trace-sweep": _trace_sweep, "delay-sweep": _delay_sweep, "seed-pr": _seed_pr}
PRESET_HELP = {
    "default": "make bench, the end-to-end headline: 24 prefetching requests and 24 "
               "bystanders, free schedule, pr27010 / pr36425 / step-clock, wait_complete and "
               "timeout, TP = local GPUs (2 on CPU); 12 repeats, more until its p50 ratios "
               "resolve 3 % (--resolve, --budget-s)",
    "cost": "the cost decomposition: the same burst pinned (host cost per step and per poll "
            "on one schedule), all protocols x policies, 6 repeats",
    "queue": "the cost decomposition on a deeper queue: 48 prefetching requests plus 48 "
             "bystanders, pinned, pr27010 / pr36425 / step-clock, wait_complete and timeout, "
             "6 repeats",
    "ci": "the gate's counts run: a smaller queue scenario (24 + 24), all protocols x "
          "policies, 1 repeat",
    "sweep": "TTFT vs arrival rate (4-32 req/s) for pr27010, pr36425, step-clock",
    "pp": "TP2 x PP2 on 4 ranks",
    "race": "PR #27550 side-car race: pre27010 vs pr36425 with a slow side-car pool",
    "lag": "SGLang #32724: a burst of 24 whose head fills the prefill budget; pr36425 vs "
           "pr32725 (pr27010 the reference), timeout, 5 repeats",
    "releases": "TP2 x PP2, buffer_only host memory, wait_complete: sglang-0.5.23 (the "
                "PP-ticket path) vs sglang-0.5.19 (pr36425), pr27010 the reference, a burst "
                "of 24 + 24 bystanders, 5 repeats",
    "trace": "real traffic: the shipped Mooncake excerpt (300 in storage, 32 replayed at 2x), "
             "device/host/storage tiers, pr27010 / pr36425, wait_complete and timeout, "
             "3 repeats",
    "delay-sweep": "make bench's workload at 0, 0.5, 1, 2, 3 ms added per control-plane "
                   "collective, interleaved (pr27010 / pr36425, 12 repeats, about 9-10 minutes "
                   "on 2 cores): ratios against c and the overhead model (sweep.md)",
    "seed-pr": "the seed PR as released: SGLang 0.5.18 against 0.5.19 (--sglang), the "
               "model's pre27010 / pr36425 in the same turns (--model-beside), make bench's "
               "burst, 10 repeats; a fidelity line per metric",
    "trace-sweep": "the excerpt's 40 requests at 1, 2, 4, 8 x their arrival rate (timeout, "
                   "pr27010 / pr36425 / step-clock, 2 repeats): TTFT, ITL and step time "
                   "against offered load",
}
