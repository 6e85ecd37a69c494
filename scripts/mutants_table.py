"""Markdown table of the mutants a `make mutate` run left alive, for docs/testing.md.

Usage: .venv/bin/python scripts/mutants_table.py [--status survived] > /tmp/survivors.md

Run from the repository root after `make mutate` (it reads mutmut's state under mutants/).
One row per mutant: its name, the function it lives in, and the line it changed (old -> new).
`--status` picks another verdict mutmut reports ("no tests", "timeout", ...).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MUTMUT = str(Path(sys.executable).with_name("mutmut"))


def mutants(status: str) -> list[str]:
    out = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True,
                         check=True).stdout
    rows = [line.strip().rsplit(": ", 1) for line in out.splitlines() if ": " in line]
    return [name for name, verdict in rows if verdict == status]


def change(name: str) -> str:
    diff = subprocess.run([MUTMUT, "show", name], capture_output=True, text=True).stdout
    old = [line[1:].strip() for line in diff.splitlines()
           if line.startswith("-") and not line.startswith("---")]
    new = [line[1:].strip() for line in diff.splitlines()
           if line.startswith("+") and not line.startswith("+++")]
    return f"`{' '.join(old)}` -> `{' '.join(new)}`".replace("|", "\\|")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--status", default="survived")
    args = parser.parse_args()
    print("| mutant | change |\n|---|---|")
    for name in mutants(args.status):
        print(f"| `{name}` | {change(name)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
