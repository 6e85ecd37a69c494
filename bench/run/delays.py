"""--collective-delay-ms: the added cost per control-plane collective (one value, the
system's collective_delay_ms) or a cost sweep (several, RunPlan.delays_ms), validated here
before any rank starts; a bad value is a ValueError of one line naming the flag."""

from __future__ import annotations

import math
from dataclasses import replace

from bench.run.plan import RunPlan


def parse(text: str | None) -> tuple[float, ...]:
    """--collective-delay-ms MS[,MS...] as ms, each finite and >= 0 (() when not given)."""
    if text is None:
        return ()
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"--collective-delay-ms takes ms >= 0, or a comma list of them for a "
                         f"cost sweep, e.g. 0,0.5,1,2,3; got {text!r}")
    return tuple(dict.fromkeys(values))


def apply(plan: RunPlan, delays: tuple[float, ...]) -> RunPlan:
    """One added cost: the system's collective_delay_ms; several: a cost sweep."""
    if len(delays) > 1:
        if plan.pairing == "duet":
            raise ValueError("a cost sweep (several --collective-delay-ms) serves in one "
                             "world: --pairing duet is not supported with it")
        return replace(plan, delays_ms=delays)
    if delays:
        system = {**dict(plan.system), "collective_delay_ms": delays[0]}
        return replace(plan, system=tuple(sorted(system.items())))
    return plan
