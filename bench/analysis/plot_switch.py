"""Whether to draw plots, kept apart from the drawing code: a run that draws none (bench ab's
block runs, the test suite) then never imports matplotlib (about 0.6 s a process here)."""

from __future__ import annotations

import os

NO_PLOTS = "BENCH_NO_PLOTS"  # "1": draw no plots (bench ab's block runs; the test suite)


def plots_wanted() -> bool:
    """False when the environment says NO_PLOTS=1: a figure costs 1-3 s here, and a caller
    that only reads the numbers (bench ab's block runs, the tests) says so."""
    return os.environ.get(NO_PLOTS) != "1"
