"""A summary a user can set beside a real engine's run: SGLang `bench_serving`'s result JSON
(0.5.23 sglang/benchmark/serving.py:1855-1907, the metrics of `calculate_metrics`,
1139-1308), one line per repeat (and time scale) in one JSON-lines file per protocol x
policy, as bench_serving appends one line per run to its --output-file.

Definitions, as bench_serving's: `duration` is the seconds from the first arrival to the
last request's last token; throughputs are per `duration` second; TTFT, ITL and E2E from
each request's own times; TPOT = (E2E - TTFT) / (output tokens - 1), requests with more
than one output token; `concurrency` = sum of E2E / duration; percentiles linear
(numpy's default), `std` the population deviation. The configuration keys beside them
(`protocol`, `policy`, `repeat`, `time_scale`...) are ours. docs/usage.md says which fields
mean the same as on a real engine and which cannot (the forward is modelled on CPU).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.rundir.files import parse_gaps, write_text_atomic
from bench.verdict.run_rules import served

STATS = ("mean", "median", "std", "p90", "p95", "p99")


def _stats(name: str, values_ms: np.ndarray) -> dict:
    if values_ms.size == 0:
        return {f"{s}_{name}_ms": None for s in STATS}
    pct = {"p90": 90, "p95": 95, "p99": 99}
    out = {f"mean_{name}_ms": float(values_ms.mean()),
           f"median_{name}_ms": float(np.median(values_ms)),
           f"std_{name}_ms": float(values_ms.std())}
    out.update({f"{k}_{name}_ms": float(np.percentile(values_ms, q)) for k, q in pct.items()})
    return out


def summary(g: pd.DataFrame) -> dict:
    """bench_serving's result fields for one repeat's requests (rows of requests.csv);
    `completed` counts the served ones, as bench_serving does (rejected ones fail there)."""
    g = served(g)
    start = float(g["arrival_s"].min())
    end = float((g["arrival_s"] + g["e2e_ms"] / 1e3).max())
    duration = end - start
    n_in, n_out = int(g["prompt_tokens"].sum()), int(g["output_tokens"].sum())
    multi = g[g["output_tokens"] > 1]
    tpot = ((multi["e2e_ms"] - multi["ttft_ms"]) / (multi["output_tokens"] - 1)).to_numpy()
    itl = np.array([x for cell in g["itl_ms"] for x in parse_gaps(cell)]) \
        if "itl_ms" in g else np.array([])
    out = {"duration": duration, "completed": len(g), "total_input_tokens": n_in,
           "total_output_tokens": n_out, "request_throughput": len(g) / duration,
           "input_throughput": n_in / duration, "output_throughput": n_out / duration,
           "total_throughput": (n_in + n_out) / duration}
    out.update(_stats("e2e_latency", g["e2e_ms"].to_numpy(float)))
    out.update(_stats("ttft", g["ttft_ms"].to_numpy(float)))
    out.update(_stats("tpot", tpot.astype(float)))
    out.update(_stats("itl", itl))
    out["concurrency"] = float(g["e2e_ms"].sum() / 1e3 / duration)
    return {k: _clean(v) for k, v in out.items()}


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write(run_dir: Path, requests: pd.DataFrame) -> list[str]:
    """One `bench_serving_<protocol>_<policy>.jsonl` per protocol x policy of a trace
    replay (none for other workloads); returns the file names."""
    if "workload" not in requests or not (requests["workload"] == "trace").all():
        return []
    names = []
    keys = ["protocol", "policy", "rate_rps", "repeat"]
    for (proto, policy), g in requests.groupby(["protocol", "policy"], sort=False):
        lines = []
        for (_, _, rate, repeat), cell in g.groupby(keys, sort=True):
            head = {"backend": "hicache-bench", "dataset_name": "mooncake",
                    "request_rate": "trace", "protocol": proto, "policy": policy,
                    "repeat": int(repeat), "offered_rate_rps": float(rate),
                    "time_scale": (float(cell["time_scale"].iloc[0])
                                   if "time_scale" in cell else None)}
            lines.append(json.dumps({**head, **summary(cell)}))
        name = f"bench_serving_{proto}_{policy}.jsonl"
        write_text_atomic(run_dir / name, "\n".join(lines) + "\n")
        names.append(name)
    return names
