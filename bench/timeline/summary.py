"""The timeline's numbers, per call site on one rank: how many collectives the window
holds, how long they took, and how much of that was waiting for a peer (bench.timeline.clock)
against the rest (the exchange itself, and whatever kept this rank from returning: the
GIL, a busy core). `bench timeline` prints it under the files it wrote."""

from __future__ import annotations

import statistics

from bench.timeline.slices import Timeline


def site_rows(tl: Timeline, rank: int = 0) -> list[dict]:
    """One row per call site of `rank`'s collectives in the window, most time first."""
    by_site: dict[str, list] = {}
    for s in tl.of_kind("collective", rank):
        by_site.setdefault(s.name, []).append(s)
    rows = []
    for site, calls in by_site.items():
        ms = [s.args["duration_ms"] for s in calls]
        wait = [s.args.get("wait_ms", 0.0) for s in calls]
        rows.append({"site": site, "thread": calls[0].thread, "n": len(calls),
                     "total_ms": sum(ms), "p50_ms": statistics.median(ms),
                     "mean_ms": statistics.fmean(ms), "mean_wait_ms": statistics.fmean(wait)})
    return sorted(rows, key=lambda r: -r["total_ms"])


def site_table(tl: Timeline, rank: int = 0) -> list[str]:
    rows = site_rows(tl, rank)
    steps = tl.window[1] - tl.window[0]
    out = [f"rank {rank}'s collectives in steps {tl.window[0]}:{tl.window[1]} ({steps} steps; "
           "wait = entered before the last peer, on rank 0's clock):",
           f"  {'site':<18} {'thread':<10} {'n':>6} {'total ms':>9} {'p50 ms':>7} "
           f"{'mean ms':>8} {'mean wait':>9}"]
    out += [f"  {r['site']:<18} {r['thread']:<10} {r['n']:>6} {r['total_ms']:>9.1f} "
            f"{r['p50_ms']:>7.3f} {r['mean_ms']:>8.3f} {r['mean_wait_ms']:>9.3f}" for r in rows]
    return out
