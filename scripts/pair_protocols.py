"""Usage: python scripts/pair_protocols.py RUN_DIR BASE OTHER [--policy POLICY]

Two protocols of one run, repeat by repeat (each repeat one whole serve, the pair of a
repeat run next to each other): OTHER over BASE for step time, ITL p50 and TTFT p50 by
request class (geometric mean of the per-repeat ratios, 95 % t interval over repeats), and
OTHER minus BASE for host time per step (step minus the modelled forward) and for time in
scheduler collectives per step (mean difference, 95 % t interval). Where the run's own
headline compares every protocol with pr27010, this compares any two (docs/metrics.md,
"Intervals"). Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.rundir.rundir import RunDir  # noqa: E402

RATIOS = ("step_ms", "itl_p50_ms", "ttft_p50_prefetch_ms", "ttft_p50_bystander_ms")
DIFFS = ("host_ms_per_step", "sync_ms_per_step")


def per_repeat(steps: pd.DataFrame, reqs: pd.DataFrame) -> pd.DataFrame:
    """One row per repeat: the statistics compared."""
    by = steps.groupby("repeat")
    cls = {c: reqs[reqs.request_class == c].groupby("repeat").ttft_ms.median()
           for c in ("prefetch", "bystander")}
    return pd.DataFrame({
        "step_ms": by.step_ms.mean(),
        "itl_p50_ms": reqs.groupby("repeat").itl_p50_ms.median(),
        "ttft_p50_prefetch_ms": cls["prefetch"], "ttft_p50_bystander_ms": cls["bystander"],
        "host_ms_per_step": (steps.step_ms - steps.forward_ms).groupby(steps.repeat).mean(),
        "sync_ms_per_step": by.sync_ms.mean(),
    })


def interval(values: pd.Series) -> tuple[float, float, float, int]:
    """Mean and its 95 % t interval, and n."""
    v = values.dropna()
    n = len(v)
    half = stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    return v.mean(), v.mean() - half, v.mean() + half, n


def compare(run: RunDir, base: str, other: str, policy: str | None) -> list[str]:
    steps, reqs = run.steps(), run.requests()
    if policy is not None:
        steps, reqs = steps[steps.policy == policy], reqs[reqs.policy == policy]
    sides = {}
    for proto in (base, other):
        s, r = steps[steps.protocol == proto], reqs[reqs.protocol == proto]
        if s.empty:
            raise ValueError(f"protocol {proto!r} is not in {run.path}")
        sides[proto] = per_repeat(s, r)
    a, b = sides[base], sides[other]
    lines = []
    for col in RATIOS:
        m, lo, hi, n = interval(np.log(b[col] / a[col]))
        lines.append(f"{col} {other}/{base}: {np.exp(m):.3f} [{np.exp(lo):.3f}, "
                     f"{np.exp(hi):.3f}] n={n}")
    for col in DIFFS:
        m, lo, hi, n = interval(b[col] - a[col])
        lines.append(f"{col} {other}-{base}: {m:+.2f} ms [{lo:+.2f}, {hi:+.2f}] n={n} "
                     f"({base} {a[col].mean():.2f} ms)")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("base")
    p.add_argument("other")
    p.add_argument("--policy")
    args = p.parse_args(argv)
    try:
        lines = compare(RunDir(args.run_dir), args.base, args.other, args.policy)
    except (ValueError, OSError) as e:
        print(f"pair_protocols: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
