"""The projection grid of the overhead model (docs/design.md section 8): protocol x policy
x TP x PP x Q (waiting requests polled per step), and a run's measured points beside the
model.

Every point is one row dict with projection.csv's columns; the markdown tables and the plot
are built from the same rows. The inputs (c and the TP it was measured over, the PP hop, the
scaling law, the base decode step) come in one Assumptions, which project.projection reads from a
run directory.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from bench.analysis.overhead import extra_step_ms, inflation, per_poll_ms, scaled_allreduce_ms
from hicache.spec.cost_model import POLICIES, PROTOCOLS, Setting, decision_per_poll

TPS = (2, 4, 8, 16, 32, 64)
PPS = (1, 2, 4)
QS = (10, 30, 100, 300, 1000)
MEASURED = ["measured_extra_step_ms", "measured_extra_step_ci_low_ms",
            "measured_extra_step_ci_high_ms"]
COLUMNS = ["source", "protocol", "policy", "tp", "pp", "polls_per_step", "scaling",
           "c_allreduce_ms", "c_hop_ms", "per_poll_ms", "extra_step_ms", "base_step_ms",
           "itl_inflation", *MEASURED]
PAYS = {(1, 1): "one TP all-reduce and one PP hop per poll",
        (1, 0): "one TP all-reduce per poll", (0, 0): "nothing per poll"}


@dataclass(frozen=True)
class Assumptions:
    """Everything a projected number depends on besides (protocol, policy, TP, PP, Q)."""

    c_ms: float  # one small all-reduce over tp0 ranks
    tp0: int
    hop_ms: float  # one PP hop, the same at every TP
    scaling: str  # bench.analysis.overhead.SCALINGS
    base_step_ms: float  # a decode step without decision collectives
    c_text: str  # where each came from, a sentence
    hop_text: str
    base_text: str


@dataclass(frozen=True)
class CostClass:
    """Protocol/policy pairs whose polls cost the same at every TP and PP."""

    label: str
    members: list[tuple[str, str]]
    pays: bool  # a poll costs a collective when TP > 1


def finite(value: object) -> bool:
    """A real, finite number (not a bool, None or NaN)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(
        value)


def model_row(a: Assumptions, protocol: str, policy: str, tp: int, pp: int,
              q: float, source: str = "model") -> dict:
    """One point: c at this TP, what one poll costs, the extra step time and ITL inflation
    with q polls per step (empty when q is unknown)."""
    c_ar = scaled_allreduce_ms(a.c_ms, a.tp0, tp, a.scaling)
    extra = (extra_step_ms(Setting(protocol, policy, tp, pp), q, c_ar, a.hop_ms) if finite(q)
             else None)
    return {"source": source, "protocol": protocol, "policy": policy, "tp": tp, "pp": pp,
            "polls_per_step": q, "scaling": a.scaling, "c_allreduce_ms": c_ar,
            "c_hop_ms": a.hop_ms,
            "per_poll_ms": per_poll_ms(protocol, policy, tp, pp, c_ar, a.hop_ms),
            "extra_step_ms": extra, "base_step_ms": a.base_step_ms,
            "itl_inflation": None if extra is None else inflation(extra, a.base_step_ms)}


def grid_rows(a: Assumptions) -> list[dict]:
    """Every protocol x policy x PP x TP x Q of the projection."""
    return [model_row(a, pro, pol, tp, pp, q) for pro in PROTOCOLS for pol in POLICIES
            for pp in PPS for tp in TPS for q in QS]


def measured_rows(summary: list[dict], a: Assumptions) -> list[dict]:
    """The run's summary rows as points: the model at their (tp, pp, polls_per_step) beside
    what the run measured there (unknown protocols are skipped: nothing to project)."""
    out = []
    for r in summary:
        if r["protocol"] not in PROTOCOLS or r["policy"] not in POLICIES:
            continue
        row = model_row(a, r["protocol"], r["policy"], int(r["tp"]), int(r["pp"]),
                        r["polls_per_step"], "measured")
        out.append(row | {c: r[c] if finite(r[c]) else None for c in MEASURED})
    return out


def cost_classes() -> list[CostClass]:
    """PROTOCOLS x POLICIES grouped by what one poll costs at TP > 1 and PP > 1, costliest
    first (at smaller layouts each group still costs the same)."""
    groups: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for pro in PROTOCOLS:
        for pol in POLICIES:
            groups.setdefault(decision_per_poll(pro, pol, 2, 2), []).append((pro, pol))
    return [CostClass(f"{members_text(m)}: "
                      f"{PAYS.get(k, f'{k[0]} all-reduces and {k[1]} hops per poll')}",
                      m, k != (0, 0)) for k, m in sorted(groups.items(), reverse=True)]


def members_text(members: list[tuple[str, str]]) -> str:
    """'pr27010 (any policy), pr36425/timeout'."""
    parts = []
    for pro in dict.fromkeys(p for p, _ in members):
        pols = [pol for p, pol in members if p == pro]
        parts += ([f"{pro} (any policy)"] if len(pols) == len(POLICIES)
                  else [f"{pro}/{pol}" for pol in pols])
    return ", ".join(parts)
