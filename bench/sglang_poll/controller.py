"""`bench sglang-poll --sglang SPEC --controller`'s engine: SGLang's own controller path
(sglang_adapter.controller.rig) on two local gloo ranks (TP2), six requests, each request's
collectives SGLang issued beside what the project's model of the release says. OK when
every request matches on every rank, both ranks ended every prefetch alike, what was
loaded is what storage holds and the door's counts equal torch's sequence numbers.
"""

from __future__ import annotations

from bench.run.launch import launch
from sglang_adapter import ControllerCase, LoadError, controller_rank, resolve, resolve_target

# A 130-page hit is read in two 128-page batches; "to-cut"'s reads stall past its budget.
CASES = [ControllerCase("wc-part", "wait_complete", 4, 3),
         ControllerCase("wc-long", "wait_complete", 130, 130),
         ControllerCase("be", "best_effort", 4, 4),
         ControllerCase("to", "timeout", 4, 4),
         ControllerCase("wc-miss", "wait_complete", 4, 0),
         ControllerCase("to-cut", "timeout", 4, 4, budget_s=4.5, slow=True)]


def rows(results: list[dict]) -> tuple[list[list], bool]:
    """Rank 0's table and whether every check held on every rank."""
    ok = results[0]["outcomes"] == results[1]["outcomes"]
    for r in results:
        ok &= r["sglang"] == r["model"] and r["loaded"][0] == r["loaded"][1]
        ok &= all(c == s for c, s in r["crosscheck"].values())
    r0, out = results[0], []
    for case in CASES:
        o, s, m = r0["outcomes"][case.rid], r0["sglang"][case.rid], r0["model"][case.rid]
        out.append([case.rid, case.policy, o["polls"], o["ended_by"], o["hit_pages"],
                    f"{s.decision}/{s.hit_query}/{s.ack}", f"{m.decision}/{m.hit_query}/{m.ack}",
                    s == m])
    return out, ok


def run_controller(spec: str) -> tuple[list[list], bool, str, dict]:
    """SPEC resolved and refused in one line (SourceError / LoadError) before any rank
    starts; then the two ranks: (rank 0's table, whether every check held, the header
    line, rank 0's result)."""
    target = resolve_target(spec)
    if target.family != "unified":
        raise LoadError(f"sglang {target.label}: the controller rig drives "
                        "UnifiedRadixCache with a HybridCacheController (0.5.19 on)")
    results = launch(2, controller_rank, (resolve(spec), 2, CASES), timeout_s=280)
    table, ok = rows(results)
    header = (f"sglang {target.label}'s controller path at TP2, held against "
              f"{results[0]['protocol']} (decision/hit-query/ack per request)")
    return table, ok, header, results[0]
