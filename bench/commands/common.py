"""What every verb shares: argparse that fails with one line, and the one wrapper that turns
bad input into that line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from bench.ab import RUN_SIZES
from bench.errors import UserError
from bench.report.printer import say_err
from bench.rundir.files import ResultFileError


class RunFailed(RuntimeError):
    """A run the verb started failed its own checks or died: exit 1 (not bad input), with
    the message as one line on stderr."""


class CliParser(argparse.ArgumentParser):
    """argparse that raises UserError (one line, exit 2 by the caller) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see --help)")

    @classmethod
    def from_doc(cls, prog: str, doc: str, **kw) -> CliParser:
        """A parser whose --help is the module's usage text: its paragraphs (split at blank
        lines, never at a line index), the `Usage:` one left to argparse, the first of the
        rest as the description and the others as the epilog, as written."""
        paragraphs = [p for p in doc.strip().split("\n\n") if p.strip()]
        if paragraphs and paragraphs[0].startswith("Usage:"):
            paragraphs = paragraphs[1:]
        description = paragraphs[0] if paragraphs else None
        epilog = "\n\n".join(paragraphs[1:]) or None
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return cls(prog=prog, description=description, epilog=epilog, **kw)


def run_verb(prog: str, body: Callable[[list[str]], int], argv: list[str],
             bad_input: tuple[type[BaseException], ...] = (UserError, ResultFileError)) -> int:
    """`body(argv)`'s exit code; an exception of `bad_input` (bad arguments, an unusable
    result file, and whatever else the verb names) is one line `prog: message` on stderr
    and exit code 2; a RunFailed is that line and exit code 1."""
    try:
        return body(argv)
    except RunFailed as e:
        say_err(f"{prog}: {e}".splitlines()[0])
        return 1
    except bad_input as e:
        say_err(f"{prog}: {e}".splitlines()[0])
        return 2


def add_cache_options(add: Callable, protocol_note: str, several: bool = False) -> None:
    """`--cache` and `--sglang`, alike in every verb that serves (`add`: the parser's
    add_argument); `protocol_note` says what becomes of the verb's protocols; `several`:
    the verb serves several SGLangs side by side (bench run)."""
    from sglang_adapter import CACHES

    add("--cache", choices=CACHES, default="project", help="the system under test: project "
        "(the project's HiCache) or sglang (SGLang's own code read from --sglang behind "
        "the same seam: bench run, see --sglang-path; bench hazards: its "
        "check_hicache_events and check_prefetch_progress on the project's data path; "
        f"{protocol_note}; docs/sglang.md)")
    add("--sglang", metavar="SPEC", help="with --cache sglang: a release (0.5.23; fetched "
        "once into ~/.cache/hicache-bench/sglang), a wheel file or a source tree"
        + ("; several, SPEC[,SPEC...] each optionally LABEL=SPEC (base=0.5.23,"
           "pr=~/sglang-pr/python): a side each, on ranks of its own, the first the "
           "reference (docs/sglang.md, Before and after)" if several else ""))


def add_size_options(add: Callable) -> None:
    """`--requests` and `--bystanders` of an A/B's runs (ab, bisect): passed to every run of
    both sides alike, to size each serve (the preset's figures when absent)."""
    add("--requests", type=int, metavar="N", help="passed to every run: prefetching requests "
        "per serve (default: the preset's)")
    add("--bystanders", type=int, metavar="N", help="passed to every run: bystanders per "
        "serve (default: the preset's)")


def size_of(args: argparse.Namespace) -> dict[str, int]:
    """The size options given: {"requests": N, "bystanders": M}, either absent."""
    return {k: getattr(args, k) for k in RUN_SIZES if getattr(args, k) is not None}
