"""Usage:
    python -m bench devcheck measure --device cuda --model llama3-8b --out devcheck.json
    python -m bench devcheck summary WORK_DIR

The device measurements of scripts/gpu_check.sh and its short summary (what they measure:
bench.devcheck). Exit 0: measured / every step passed; 1: a step failed; 2: bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.report.printer import fit, say

PROG = "bench devcheck"


def _main(argv: list[str]) -> int:
    p = CliParser.from_doc(f"python -m {PROG}", __doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    m.add_argument("--model", default="llama3-8b", help="the model shape of the forward")
    m.add_argument("--out", type=Path, required=True, help="where devcheck.json goes")
    s = sub.add_parser("summary")
    s.add_argument("work_dir", type=Path, help="scripts/gpu_check.sh's work folder")
    args = p.parse_args(argv)
    from bench.devcheck import device_lines, measure, summary_lines  # torch: once args hold

    if args.cmd == "measure":
        result = measure(args.device, args.model)
        args.out.write_text(json.dumps(result, indent=2))
        where = result.get("gpu") or result["device"]
        say(fit(f"{PROG}: measured on {where}, every figure in {args.out}",
                *device_lines(result)))
        return 0
    lines, ok = summary_lines(args.work_dir)
    say("\n".join(lines))
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv)
