"""`python -m sglang_adapter.controller_check SPEC`: SGLang's own controller path
(sglang_adapter.controller) on two local gloo ranks (TP2), six requests, each request's
collectives SGLang issued beside what the project's model of the release says; OK (exit 0)
when every request matches on every rank, both ranks ended every prefetch alike, what was
loaded is what storage holds and the door's counts equal torch's sequence numbers, else
FAILED (exit 1); a SPEC that cannot be had or driven: one line, exit 2. SPEC as for
`--sglang` (docs/sglang.md): a release, a wheel, or a source tree (a PR's checkout).
"""

from __future__ import annotations

import sys

from bench.run.launch import LaunchError, launch
from sglang_adapter.controller import ControllerCase, controller_rank
from sglang_adapter.loader import LoadError
from sglang_adapter.source import SourceError, resolve
from sglang_adapter.target import resolve_target

CASES = [ControllerCase("wc-part", "wait_complete", 4, 3),
         ControllerCase("wc-long", "wait_complete", 130, 130),
         ControllerCase("be", "best_effort", 4, 4),
         ControllerCase("to", "timeout", 4, 4),
         ControllerCase("wc-miss", "wait_complete", 4, 0),
         ControllerCase("to-cut", "timeout", 4, 4, budget_s=4.5, slow=True)]
COLUMNS = ("request", "policy", "polls", "ended_by", "hit_pages", "sglang d/h/a", "model d/h/a",
           "ok")


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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sglang_adapter.controller_check SPEC", file=sys.stderr)
        return 2
    try:
        target = resolve_target(argv[0])  # refused here, before any rank starts
        if target.family != "unified":
            raise LoadError(f"sglang {target.label}: the controller rig drives "
                            "UnifiedRadixCache with a HybridCacheController (0.5.19 on)")
        results = launch(2, controller_rank, (resolve(argv[0]), 2, CASES), timeout_s=280)
    except (SourceError, LoadError) as e:
        print(e, file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    table, ok = rows(results)
    print(f"sglang {target.label}'s controller path at TP2, held against "
          f"{results[0]['protocol']} (decision/hit-query/ack per request)")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in table:
        print("| " + " | ".join(str(v) for v in row) + " |")
    print(f"pages loaded = storage: {results[0]['loaded'][1]} of {results[0]['loaded'][0]}; "
          f"door = torch's sequence numbers: {results[0]['crosscheck']}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
