"""SGLang's own poll on this machine's ranks, held against the project's model of the
release (docs/sglang.md): the engine of `bench sglang-poll`.

Every rank loads SGLang from the SPEC (sglang_adapter.loader) and polls one pending prefetch
per policy with SGLang's own `check_prefetch_progress` (sglang_adapter.decisions.poll); the door
counts each collective at SGLang's call site. Per request: rank 0's decision collectives
per poll that reached the decision, beside `hicache.spec.cost_model.decision_per_poll` of the
protocol the project models the release with, and its per-step collectives
(check_hicache_events) beside `per_step`; a row is OK when both are equal, every rank
polled alike and the door's counts equal torch's sequence numbers on every group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bench.run.launch import launch
from hicache.spec.cost_model import decision_per_poll, per_step
from sglang_adapter import MODELLED, POLICIES, PollCase, Source, modelled_protocol  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class PollOptions:
    source: Source | None  # None only while the options are checked, before resolving
    tp: int = 2
    pp: int = 1
    policies: tuple[str, ...] = POLICIES
    pending_polls: int = 3
    protocol: str = "sglang-0.5.23"  # the model the counts are held against

    def __post_init__(self):
        if self.tp < 1 or self.pp < 1 or self.tp * self.pp > 8:
            raise ValueError(f"--tp {self.tp} --pp {self.pp}: 1..8 ranks in all")
        for policy in self.policies:
            PollCase(policy, self.pending_polls)  # validates both


def run_polls(opts: PollOptions, timeout_s: float = 600.0) -> tuple[list[dict], bool]:
    """(one row per request, whether every check held)."""
    from sglang_adapter import poll_rank  # torch: only once the options held

    cases = [PollCase(p, opts.pending_polls) for p in opts.policies]
    results = launch(opts.tp * opts.pp, poll_rank, (opts.source, opts.tp, opts.pp, cases),
                     timeout_s=timeout_s)
    agreed = all(r["outcomes"] == results[0]["outcomes"] for r in results)
    seq_ok = all(c == s for r in results for c, s in r["crosscheck"].values())
    rows = [_row(opts, rid, out, results[0]["calls"], agreed, seq_ok)
            for rid, out in results[0]["outcomes"].items()]
    return rows, all(r["ok"] for r in rows)


def _row(opts: PollOptions, rid: str, out: dict, calls: list, agreed: bool,
         seq_ok: bool) -> dict:
    policy = rid.rsplit("-", 1)[0]
    sites: Counter[str] = Counter()
    step_calls = 0
    for site, group, op, call_rid, via, n in calls:
        if call_rid == rid:
            sites[f"{op}@{group} {site} < {via}"] += n
        step_calls += n if call_rid == f"{rid}/step" else 0
    # wait_complete's last poll finds it ended by its completion: it reaches no decision.
    decided = out["polls"] - (policy == "wait_complete")
    t, p = decision_per_poll(opts.protocol, policy, opts.tp, opts.pp)
    per_poll = sum(sites.values()) / decided if decided else 0.0
    st, sp = per_step(opts.protocol, opts.tp, opts.pp)  # rank 0's
    steps = out["polls"]  # one check_hicache_events per step, one poll per step
    return {"request": rid, "policy": policy, "polls": out["polls"],
            "sglang_per_poll": per_poll, "model_per_poll": t + p,
            "sglang_per_step": step_calls / steps, "model_per_step": st + sp,
            "ranks_agree": agreed, "seq_match": seq_ok,
            "ok": per_poll == t + p and step_calls == (st + sp) * steps and agreed and seq_ok,
            "call_sites": "; ".join(f"{n}x {s}" for s, n in sorted(sites.items()))}
