"""Scratch git histories of this tree for the real ab, bisect and gate tests: a copy of the
working tree committed as one base commit, and commits on top (a harmless one, a slower
poll). The venv is this test's own: a command run with cwd = the scratch tree imports the
scratch tree's bench and hicache (the cwd comes first on sys.path)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".venv", ".git", "results", "__pycache__", ".*_cache",
                                "*.egg-info")
ANCHOR = '    name = "pr36425"\n\n    def vote(self, f: Facts) -> Vote:\n'


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example",
                           *args], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def scratch_repo(dst: Path) -> tuple[Path, str]:
    """This working tree, copied and committed as the base of a fresh repository."""
    shutil.copytree(REPO, dst, ignore=IGNORE)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-qm", "base")
    return dst, git(dst, "rev-parse", "HEAD")


def commit(repo: Path, message: str, edit: Callable[[Path], None]) -> str:
    edit(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def slow_poll(seconds: float) -> Callable[[Path], None]:
    """An edit that makes pr36425's poll sleep `seconds`: a regression with no collective."""
    def edit(repo: Path) -> None:
        path = repo / "hicache" / "agreement" / "protocols.py"
        text = path.read_text()
        assert ANCHOR in text, "the anchor moved: update the test's patch"
        text = text.replace("from __future__ import annotations\n",
                            "from __future__ import annotations\n\nimport time\n", 1)
        path.write_text(text.replace(
            ANCHOR, ANCHOR + f"        time.sleep({seconds})  # the regression under test\n"))
    return edit


def harmless(repo: Path) -> None:
    with open(repo / "docs" / "metrics.md", "a") as f:
        f.write("\nA harmless edit.\n")


def bench(repo: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """`python -m bench ARGS` in the scratch tree."""
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=repo,
                          capture_output=True, text=True, timeout=timeout)
