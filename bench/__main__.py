"""Usage:
    python -m bench run [options]      the main job (see `python -m bench run --help`)
    python -m bench report RUN_DIR     rebuild plots and report.md from a run's CSVs
    python -m bench gate RUN_DIR       CI perf gate against results/baseline
    python -m bench compare RUN_A RUN_B  two runs side by side: counts and timing ratios B/A
    python -m bench microbench RUN_DIR micro-benchmarks (pytest-benchmark) saved with a run
    python -m bench project RUN_DIR    predicted step overhead and ITL inflation at TP 2-64,
                                       PP 1-4, 10-1000 polled requests, from the run's c
    python -m bench devcheck ...       device checks of scripts/gpu_check.sh (H2D, forward)
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        from bench.commands.run import main_run

        return main_run(rest)
    if cmd == "report":
        from bench.report import main_report

        return main_report(rest)
    if cmd == "gate":
        from bench.gate import main_gate

        return main_gate(rest)
    if cmd == "compare":
        from bench.compare import main_compare

        return main_compare(rest)
    if cmd == "microbench":
        from bench.microbench import main_microbench

        return main_microbench(rest)
    if cmd == "project":
        from bench.project import main_project

        return main_project(rest)
    if cmd == "devcheck":
        from bench.devcheck import main_devcheck

        return main_devcheck(rest)
    print(f"bench: unknown command {cmd!r}; use run, report, gate, compare, microbench, "
          "project or devcheck",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # e.g. `| head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
