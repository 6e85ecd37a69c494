"""argparse that fails with one line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(ValueError):
    """Bad command-line arguments; the message is one line."""


class CliParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2 by the caller) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")
