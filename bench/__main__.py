"""`python -m bench VERB ...`: one verb per module of bench/commands (their table:
bench.commands.VERBS)."""

from __future__ import annotations

import importlib
import os
import sys

from bench.commands import VERBS
from bench.report.printer import say, say_err, wrapped


def usage() -> str:
    """Each verb's call, its purpose below it (lines within the printer's width)."""
    lines = []
    for name, (args, help_, _) in VERBS.items():
        lines += wrapped([f"    python -m bench {name} {args}", f"        {help_}"])
    return "Usage:\n" + "\n".join(lines) + "\n\n`python -m bench VERB --help` for a verb's options."


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        say(usage())
        return 0 if argv else 2
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        say_err(f"bench: unknown command {verb!r}; use {', '.join(VERBS)}")
        return 2
    return importlib.import_module(VERBS[verb][2]).main(rest)


def entry() -> None:
    """The process's entry point: `python -m bench` and the `hicache-bench` console script."""
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # e.g. `| head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    entry()
