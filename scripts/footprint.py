"""Peak memory and wall time of a command and every process it starts (Linux /proc).

Usage:
    .venv/bin/python scripts/footprint.py [--interval S] [--out FILE.json] -- COMMAND...

e.g. the trace preset, and a 1,000-request replay of the full trace:
    .venv/bin/python scripts/footprint.py --out results/footprint_trace.json -- \\
        .venv/bin/python -m bench run --preset trace
    .venv/bin/python scripts/footprint.py --out results/footprint_1000.json -- \\
        .venv/bin/python -m bench run --preset trace --trace FULL.jsonl --trace-requests 1000

Every `--interval` seconds (0.2) it sums the resident memory of the command's process tree
(the launcher and every rank); it reports the peak of that sum, the largest single process
(also from getrusage, which the kernel keeps exactly), and the wall time. A tree sampled
every 0.2 s can miss a shorter peak: the single-process figure cannot. Prints one line and
exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(root: int) -> int:
    kids, total, stack = _children(), 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_bytes(pid)
        stack.extend(kids.get(pid, []))
    return total


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--out", type=Path)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command given (put it after --)")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(args.interval)
    wall = time.monotonic() - t0
    single = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    result = {"command": cmd, "exit_code": proc.returncode, "wall_s": round(wall, 1),
              "peak_tree_rss_mib": round(peak / 2**20, 1),
              "peak_single_process_rss_mib": round(single / 2**20, 1),
              "interval_s": args.interval}
    print(f"footprint: wall {wall:.1f} s, peak RSS {peak / 2**20:.0f} MiB (all processes), "
          f"{single / 2**20:.0f} MiB (largest one), exit {proc.returncode}", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
