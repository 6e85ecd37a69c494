"""Usage: python scripts/test_all.py [--no-record] [TIER ...]   (make test-all)

Runs every test tier, one after another, and records the result of the run in
docs/results/test_all.md (between the `test-all` markers): date, commit (+dirty), and per tier its
command, PASS/FAIL, pytest's closing line and the wall time. Tiers: test (make test: the
README's command), long (make test-long), sglang-check (the SGLang matrix), stats (the
statistical checks). Exit 0
when every tier passed, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "results" / "test_all.md"
BEGIN, END = "<!-- test-all: begin -->", "<!-- test-all: end -->"
TIERS = {"test": ["make", "test"], "long": ["make", "test-long"],
         "sglang-check": ["make", "sglang-check"],
         "stats": ["make", "test-stats"]}
CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed|error).*?)\s*=*$")


def closing_lines(out: str) -> str:
    """pytest's closing lines ('N passed, M skipped in Ts'), one per pytest call, joined."""
    return "; ".join(m.group(1) for line in out.splitlines() if (m := CLOSING.match(line)))


def run_tier(name: str) -> dict:
    start = time.monotonic()
    done = subprocess.run(TIERS[name], cwd=REPO, capture_output=True, text=True)
    sys.stdout.write(done.stdout[-1500:])
    return {"tier": name, "command": " ".join(TIERS[name]),
            "result": "PASS" if done.returncode == 0 else "FAIL",
            "pytest": closing_lines(done.stdout) or "(no pytest line)",
            "seconds": round(time.monotonic() - start)}


def commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                         capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return sha + ("+dirty" if dirty else "")


def block(rows: list[dict]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, f"Last `make test-all`: {stamp}, commit {commit()}.", "",
             "| tier | command | result | pytest | wall s |", "|---|---|---|---|---|"]
    lines += [f"| {r['tier']} | `{r['command']}` | {r['result']} | {r['pytest']} | "
              f"{r['seconds']} |" for r in rows]
    return "\n".join(lines + [END])


def record(rows: list[dict]) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"test_all: {DOC} lacks the {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(head + block(rows) + rest.split(END, 1)[1])


def main(argv: list[str]) -> int:
    no_record = "--no-record" in argv
    names = [a for a in argv if a != "--no-record"] or list(TIERS)
    if bad := [n for n in names if n not in TIERS]:
        print(f"test_all: unknown tier {bad[0]!r}; choose from {', '.join(TIERS)}",
              file=sys.stderr)
        return 2
    rows = [run_tier(n) for n in names]
    if not no_record:
        record(rows)
    for r in rows:
        print(f"{r['tier']:<13} {r['result']}  {r['pytest']}  ({r['seconds']} s)")
    ok = all(r["result"] == "PASS" for r in rows)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
