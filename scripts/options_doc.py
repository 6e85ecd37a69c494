"""Usage: python scripts/options_doc.py [--check]

Rewrites docs/options.md from the verbs' parsers (bench.commands.options_doc); --check
only says whether the page is current (exit 1 when it is not).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.commands.options_doc import options_markdown  # noqa: E402

PAGE = REPO / "docs" / "options.md"


def main(argv: list[str]) -> int:
    text = options_markdown()
    if argv == ["--check"]:
        current = PAGE.exists() and PAGE.read_text() == text
        print(f"{PAGE.relative_to(REPO)} is {'current' if current else 'stale'}")
        return 0 if current else 1
    if argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
