"""`bench run`'s start and end of a cost sweep (several --collective-delay-ms: every cost's
rows in a run directory of its own, bench.run.plan.RunPlan.per_delay): sweep.json names
them before the ranks start; at the end every cost's report, then the sweep's
(bench.analysis.sweep), printed, and one OK/FAILED line."""

from __future__ import annotations

import time
from pathlib import Path

from bench.report.printer import say, say_err
from bench.run.plan import RunPlan, delay_dir


def announce(plan: RunPlan) -> None:
    """sweep.json (bench.analysis.sweep) names every cost's run directory."""
    from bench.analysis.sweep import write_manifest

    write_manifest(Path(plan.out_dir), plan.delays_ms, [delay_dir(d) for d in plan.delays_ms])
    say_err(f"cost sweep: +{', +'.join(f'{d:g}' for d in plan.delays_ms)} ms per control-plane "
            f"collective, interleaved in every repeat")


def finish(run_dir: Path, t0: float, error: str | None = None) -> int:
    """A sweep's end: every cost's report, then the sweep's (bench.analysis.sweep)."""
    from bench.analysis.plot_switch import plots_wanted
    from bench.analysis.sweep import write_sweep

    took = f"({time.monotonic() - t0:.0f}s, {run_dir})"
    try:
        report = write_sweep(run_dir, plots=plots_wanted())
    except ValueError as e:  # ResultFileError: a result file the ranks wrote is unusable
        say(f"FAILED: could not build the sweep's report: {e} {took}")
        return 1
    say("\n".join(report.lines))
    ok = report.ok and error is None and bool(report.rows)
    say(f"{'OK' if ok else 'FAILED'}: cost sweep, every cost's run "
        f"{'passed' if report.ok else 'did NOT pass'} its checks{f'; {error}' if error else ''} "
        f"{took}")
    return 0 if ok else 1
