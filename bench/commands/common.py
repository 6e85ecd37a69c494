"""What every verb shares: argparse that fails with one line, and the one wrapper that turns
bad input into that line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from bench.rundir.files import ResultFileError


class UsageError(ValueError):
    """Bad command-line arguments; the message is one line."""


class CliParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2 by the caller) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def run_verb(prog: str, body: Callable[[list[str]], int], argv: list[str],
             bad_input: tuple[type[BaseException], ...] = (UsageError, ResultFileError)) -> int:
    """`body(argv)`'s exit code; an exception of `bad_input` (bad arguments, an unusable
    result file, and whatever else the verb names) is one line `prog: message` on stderr
    and exit code 2."""
    try:
        return body(argv)
    except bad_input as e:
        print(f"{prog}: {e}".splitlines()[0], file=sys.stderr)
        return 2
