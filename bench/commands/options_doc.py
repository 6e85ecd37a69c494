"""docs/options.md, generated from the verbs' own parsers: every option of every verb, its
default and its help, so the page cannot drift from `--help` (tests/test_docs.py holds the
two equal; `python scripts/options_doc.py` rewrites the page)."""

from __future__ import annotations

import argparse
import importlib

from bench.commands import VERBS
from bench.commands.common import CliParser

HEADER = """# Every option, verb by verb

Generated from the parsers by `python scripts/options_doc.py`; `python -m bench VERB --help`
prints the same, with each verb's usage text. How to use them: [usage](usage.md).
"""


class _Captured(BaseException):
    """Raised instead of parsing: carries the verb's parser out of its main()."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser `python -m bench VERB` builds, taken at its parse_args call."""
    def capture(self, *args, **kw):
        raise _Captured(self)
    saved = CliParser.parse_args
    CliParser.parse_args = capture
    try:
        importlib.import_module(VERBS[verb][2]).main([])
    except _Captured as c:
        return c.parser
    finally:
        CliParser.parse_args = saved
    raise AssertionError(f"bench {verb} never parsed its arguments")


def _cell(text: object) -> str:
    return " ".join(str(text).replace("%%", "%").replace("|", "\\|").split())


def _default(action: argparse.Action) -> str:
    if action.required or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
        return ""
    return f"`{action.default}`"


def _rows(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    rows = []
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                rows += _rows(sub, f"{prefix}{name} ")
            continue
        name = ", ".join(action.option_strings) or action.dest.upper()
        choices = f" (one of {', '.join(map(str, action.choices))})" if action.choices else ""
        rows.append(f"| `{prefix}{name}` | {_default(action)} | "
                    f"{_cell((action.help or '') + choices)} |")
    return rows


def options_markdown() -> str:
    """The whole page."""
    parts = [HEADER]
    for verb, (args, help_, _) in VERBS.items():
        parts += [f"## `bench {verb} {args}`", "", _cell(help_) + ".", "",
                  "| option | default | what |", "|---|---|---|",
                  *_rows(verb_parser(verb)), ""]
    return "\n".join(parts)
