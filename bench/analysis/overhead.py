"""The overhead model of docs/design.md section 8, as arithmetic: what the decision
collectives of the waiting-queue walk add to every scheduler step, and the ITL inflation
that implies.

    extra scheduler time per step = polls per step x (T x c_ar + P x (PP - 1) x c_hop)
                                    + completion MINs per step x c_ar
                                    - hidden per-step MINs x c_ar

The last term is a pipelined per-step agreement's (PR #39903, cost_model.hidden_per_step):
its MIN is issued at the end of one step and waited on at the next, so the step no longer
waits c_ar for it when the forward outlasts it.

c_ar is one small all-reduce on the TP control-plane group (measured by the run's
calibration, bench.run.calibrate), c_hop one point-to-point PP hop (measured when PP > 1, else
taken as half a 2-rank all-reduce: one message instead of a round trip). T and P come from
hicache.spec.cost_model.decision_per_poll. The walk's collectives run on the CPU before the
forward is launched, so they add to the step, and every running request's inter-token
latency pays them.

Scaling to other TP sizes (projection only): gloo's small-message all-reduce is latency
bound, 2 (p - 1) sequential messages for the ring algorithm, so c_ar(p) = c_ar(p0) x
(p - 1) / (p0 - 1); "log2" assumes a tree or recursive doubling instead. Both are
assumptions, stated wherever a projection is printed.
"""

from __future__ import annotations

import math

from hicache.spec.cost_model import Setting, decision_per_poll, hidden_per_step

SCALINGS = ("ring", "log2")


def scaled_allreduce_ms(c_ms: float, tp_measured: int, tp: int, scaling: str = "ring") -> float:
    """One small all-reduce over `tp` ranks, from one measured over `tp_measured` ranks."""
    if scaling not in SCALINGS:
        raise ValueError(f"unknown scaling {scaling!r}; choose from {', '.join(SCALINGS)}")
    if tp_measured < 2 or tp < 1:
        raise ValueError(f"need a measurement over >= 2 ranks and tp >= 1, got "
                         f"{tp_measured} and {tp}")
    if tp == 1:
        return 0.0  # SGLang skips the all-reduce at TP 1
    if scaling == "ring":
        return c_ms * (tp - 1) / (tp_measured - 1)
    return c_ms * math.log2(tp) / math.log2(tp_measured)


def hop_ms(c_ar_ms: float, tp_measured: int, c_hop_measured_ms: float | None) -> float:
    """A PP hop's latency: measured, else half a 2-rank all-reduce (one message, not two)."""
    if c_hop_measured_ms is not None and not math.isnan(c_hop_measured_ms):
        return c_hop_measured_ms
    return scaled_allreduce_ms(c_ar_ms, tp_measured, 2) / 2


def per_poll_ms(protocol: str, policy: str, tp: int, pp: int, c_ar_ms: float,
                c_hop_ms: float, host_memory: str = "cache") -> float:
    """Scheduler time one poll of a pending prefetch spends in decision collectives."""
    t, p = decision_per_poll(protocol, policy, tp, pp, host_memory)
    return t * c_ar_ms + p * (pp - 1) * c_hop_ms


def extra_step_ms(setting: Setting, polls_per_step: float, c_ar_ms: float, c_hop_ms: float,
                  completions_per_step: float = 0.0) -> float:
    """Predicted extra scheduler time per step from decision (and completion) collectives,
    less the per-step MIN a pipelined agreement hides (`setting`'s pools aside from its host
    memory do not matter here)."""
    protocol, tp, pp = setting.protocol, setting.tp, setting.pp
    completion = completions_per_step * c_ar_ms if tp > 1 else 0.0
    per_poll = per_poll_ms(protocol, setting.policy, tp, pp, c_ar_ms, c_hop_ms,
                           setting.host_memory)
    hidden = hidden_per_step(protocol, tp, pp) * c_ar_ms
    return polls_per_step * per_poll + completion - hidden


def inflation(extra_ms: float, base_step_ms: float) -> float:
    """Step time (ITL, scheduling lag) with the extra time over without it: 1 + extra/base."""
    if not base_step_ms > 0:
        raise ValueError(f"base step time must be > 0, got {base_step_ms}")
    return 1.0 + extra_ms / base_step_ms


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two closed intervals [low, high] share a point (NaN bounds never do)."""
    if any(math.isnan(v) for v in (*a, *b)):
        return False
    return bool(max(a[0], b[0]) <= min(a[1], b[1]))
