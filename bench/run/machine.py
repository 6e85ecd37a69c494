"""Was a serve disturbed by something outside it? The machine's own account (Linux
/proc/stat) of the CPU time it lost while the serve ran.

Under a pinned schedule every repeat of a configuration replays one schedule, so what
varies between them is the machine. Most of that is the collectives' own tail (the kernel's
tick: docs/results/2026-12-02_pinned_quiet_49fa5c3.md), which every serve has. But now and
then a whole serve runs several times slower: the hypervisor gave the vCPUs to someone
else (steal time), or another process ran beside the ranks. One such serve widens a
6-repeat interval several times over. Both are visible from outside the measured metric:

- steal: CPU time the hypervisor took from this VM's CPUs during the serve;
- other: CPU time the machine spent busy (user, nice, system, irq, softirq) that the ranks'
  own threads did not use (their process_time over the same serve), e.g. another program.

A serve whose steal + other exceeds `LIMIT` of its cores x wall time is disturbed; under a
pinned schedule the run serves it again (the same schedule: its digest is judged like any
other), up to `--redo-disturbed` more times, and keeps the last serve (bench.run.worker).
The criterion never reads a step time, so it cannot favour a protocol.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench.rundir.schema import DISTURBED_LIMIT as LIMIT  # of cores x wall time


@dataclass(frozen=True)
class CpuTimes:
    busy_s: float
    steal_s: float


def read() -> CpuTimes | None:
    """The machine's busy and steal seconds so far, over all CPUs; None where /proc/stat
    cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    return CpuTimes((user + nice + system + irq + softirq) / hz, steal / hz)


def threads() -> int | None:
    """This process's threads, the interpreter's and native ones (gloo's, torch's); None
    where /proc cannot be read (not Linux). A count that grows from serve to serve is
    something each serve left behind, running beside every later one."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def interference(before: CpuTimes | None, after: CpuTimes | None, ranks_cpu_s: float,
                 wall_s: float) -> dict:
    """steal_s, other_cpu_s and their sum as a fraction of cores x wall (`lost`), for one
    serve; NaN-free: unknown is None."""
    if before is None or after is None or wall_s <= 0:
        return {"steal_s": None, "other_cpu_s": None, "lost": None}
    steal = max(0.0, after.steal_s - before.steal_s)
    other = max(0.0, after.busy_s - before.busy_s - ranks_cpu_s)
    cores = os.cpu_count() or 1
    return {"steal_s": round(steal, 3), "other_cpu_s": round(other, 3),
            "lost": round((steal + other) / (cores * wall_s), 4)}


def disturbed(measured: dict, limit: float = LIMIT) -> str | None:
    """Why a serve counts as disturbed ('steal 0.41 s, other processes 0.12 s: 9% of the
    cores' time (limit 5%)'), or None."""
    lost = measured.get("lost")
    if lost is None or lost <= limit:
        return None
    return (f"steal {measured['steal_s']:.2f} s, other processes {measured['other_cpu_s']:.2f} "
            f"s: {100 * lost:.0f}% of the cores' time (limit {100 * limit:.0f}%)")
