"""Fake gate results (decision.json, schema 1) for the history's tests: a commit's ratios
drawn around planted true values with the gate's quiet interval widths, from a seeded
generator, so every test reads the same numbers every time."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

METRICS = ("step_mean", "itl_p50", "prefetch_ttft_p50", "bystander_ttft_p50")
THRESHOLDS = {"step_mean": 0.03, "itl_p50": 0.05, "prefetch_ttft_p50": 0.05,
              "bystander_ttft_p50": 0.1}
Z95 = 1.959964


def sha(i: int) -> str:
    """Commit i's fake sha (40 hex digits, distinct from the first 8)."""
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def verdict_of(low: float, high: float, threshold: float) -> str:
    return "PASS" if high < 1 + threshold else "FAIL" if low > 1 + threshold else "INCONCLUSIVE"


def decision(i: int, truth, rng: random.Random, a: int = 0, n_metrics: int = 4,
             protocols: tuple = ("pr27010", "pr36425"), thresholds: dict = THRESHOLDS,
             **over) -> dict:
    """Commit i's gate result against the baseline revision sha(a), over the first
    n_metrics gated metrics of each protocol; truth(metric, protocol) -> the true B/A."""
    metrics = []
    for protocol in protocols:
        for metric in METRICS[:n_metrics]:
            s = rng.uniform(0.015, 0.03) / Z95
            r = math.exp(rng.gauss(math.log(truth(metric, protocol)), s))
            low, high = r * math.exp(-Z95 * s), r * math.exp(Z95 * s)
            metrics.append({"metric": metric, "protocol": protocol, "policy": "wait_complete",
                            "layout": "tp2 pp1", "ratio": r, "low": low, "high": high,
                            "half_width": Z95 * s, "needed_half_width": None,
                            "threshold": thresholds[metric],
                            "verdict": verdict_of(low, high, thresholds[metric]),
                            "pairs": 24, "note": ""})
    verdicts = {m["verdict"] for m in metrics}
    whole = "FAIL" if "FAIL" in verdicts else "INCONCLUSIVE" if "INCONCLUSIVE" in verdicts \
        else "PASS"
    return {"schema": 1, "kind": "gate", "verdict": whole,
            "exit_code": {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 77}[whole],
            "created": f"2026-12-07T{i // 60:02d}:{i % 60:02d}:00Z", "host": "ci-box",
            "cores": 2, "commit": sha(i), "dirty": False, "branch": "main",
            "a": {"label": sha(a)[:7], "commit": sha(a), "spec": None},
            "b": {"label": "worktree", "commit": sha(i), "spec": None},
            "preset": "default", "schedule": "pinned", "protocols": ["pr27010", "pr36425"],
            "policies": ["wait_complete"], "thresholds": thresholds,
            "estimator": "t-mean-log", "level": 0.95, "pairs": 24, "pairs_kept": 24,
            "seconds": 200.0, "disturbance": {"cpu_lost_p50": 0.01, "cpu_lost_p90": 0.03,
                                              "quiet": True, "quiet_limit": 0.05},
            "exact": {"checks": 136, "failed": 0}, "metrics": metrics, **over}


def write(folder: Path, d: dict, name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or f"{d['commit'][:12]}_{d['created'][-9:-1]}.json".replace(":", ""))
    path.write_text(json.dumps(d))
    return path
