"""`bench run`'s workload and cache-tier flags: a trace replay (bench.run.trace) instead of the
synthetic workload, its window and load, and the device tier's write path (hicache.cache.tiers).
Validated here, before any rank starts; a bad trace file is one line naming its line."""

from __future__ import annotations

from pathlib import Path

from hicache.spec.config import WRITE_POLICIES


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


