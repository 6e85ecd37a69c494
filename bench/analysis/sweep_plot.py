"""A cost sweep's figure (bench.analysis.sweep): pr36425's ratios over pr27010 against c,
the control-plane all-reduce's cost measured at each added cost, with their 95% intervals
and the overhead model's predicted step ratio as a line. Matplotlib's object API (Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from bench.rundir.files import atomic_open

MARKERS = {"step_mean": "o", "prefetch_ttft_p50": "s", "bystander_ttft_p50": "^",
           "itl_p50": "v", "e2e_p50": "D"}


def draw(rows: list[dict], path: Path, metrics: dict[str, str],
         policies: tuple[str, ...]) -> None:
    """One panel per policy: every metric's ratio against c, and the model's step line
    (`metrics` and `policies` are bench.analysis.sweep's, passed in: no import back)."""
    fig = Figure(figsize=(11, 4.6))
    axes = fig.subplots(1, len(policies), sharey=True)
    for ax, policy in zip(axes, policies, strict=True):
        sub = [r for r in rows if r["policy"] == policy]
        if not sub:
            continue
        c = np.array([r["c_ms"] for r in sub])
        for i, (m, label) in enumerate(metrics.items()):
            y = np.array([r[f"{m}_ratio"] for r in sub])
            err = np.array([[yy - r[f"{m}_ratio_ci_low"], r[f"{m}_ratio_ci_high"] - yy]
                            for yy, r in zip(y, sub, strict=True)]).T
            shift = (i - 2) * 0.02 * max(c.max(), 1.0)  # side by side at one c
            ax.errorbar(c + shift, y, yerr=err, fmt=MARKERS[m] + "-", ms=4, capsize=2,
                        lw=1.6 if m == "step_mean" else 0.8, label=label, color=f"C{i}")
        ax.plot(c, [r["model_step_ratio"] for r in sub], "k--", lw=1.2,
                label="model: step (polls/step x c)")
        for x, r in zip(c, sub, strict=True):  # the added cost, along the top
            ax.text(x, 0.98, f"+{r['delay_ms']:g}", transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=7, color="0.4")
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_title(f"{policy}: pr36425 / pr27010")
        ax.set_xlabel("c: one control-plane all-reduce beside the cells, ms (incl. added cost)")
    axes[0].set_ylabel("ratio [95% CI over paired repeats]")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
