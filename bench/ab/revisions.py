"""Git revisions for `bench ab` and `bench bisect`: resolve a name to a commit, check the
working tree, check a commit out as a detached worktree, list the commits between two.

WORKTREE names the working tree as it is, uncommitted changes included: it is snapshotted
into a detached worktree (HEAD, its diff and its untracked files that git does not ignore)
as every commit is checked out into one, so both sides of an A/B run from equivalent
trees (same layout, no results/ or bytecode caches of earlier runs); every other name must
resolve to a commit.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.rundir.files import ResultFileError

WORKTREE = "WORKTREE"
GIT_TIMEOUT_S = 120


class RevisionError(ResultFileError):
    """A revision that cannot be used (unknown, or HEAD with a dirty tree): one line, exit 2."""


def git(args: list[str], repo: Path) -> str:
    """stdout of one git command in `repo`; RevisionError (one line) when it fails."""
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise RevisionError(f"git {args[0]} failed: {e}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RevisionError(f"git {' '.join(args[:2])}: {why}")
    return done.stdout


@dataclass(frozen=True)
class Revision:
    """A name as the user gave it and the commit it named (None: the working tree)."""

    name: str
    sha: str | None

    @property
    def short(self) -> str:
        return "worktree" if self.sha is None else self.sha[:10]

    @property
    def label(self) -> str:
        return self.name if self.sha is None or self.name.startswith(self.short) \
            else f"{self.name} ({self.short})"


def dirty(repo: Path) -> bool:
    """Whether the working tree differs from HEAD (tracked changes or untracked files that
    git does not ignore)."""
    return bool(git(["status", "--porcelain"], repo).strip())


def resolve(name: str, repo: Path) -> Revision:
    """The commit `name` names; RevisionError for an unknown name, or for HEAD (by any name)
    while the working tree is dirty: HEAD's commit would not be what is on disk."""
    if name == WORKTREE:
        return Revision(name, None)
    try:
        sha = git(["rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], repo).strip()
    except RevisionError:
        raise RevisionError(f"unknown revision {name!r} (not a commit in {repo})") from None
    head = git(["rev-parse", "HEAD"], repo).strip()
    if sha == head and dirty(repo):
        raise RevisionError(f"{name} is HEAD ({sha[:10]}) but the working tree has changes: "
                            f"commit or stash them, or name the working tree {WORKTREE}")
    return Revision(name, sha)


@contextmanager
def checked_out(rev: Revision, repo: Path, where: Path | None = None) -> Iterator[Path]:
    """A detached git worktree holding `rev` (for WORKTREE: a snapshot of the working tree
    as it is now), in `where` or a temporary directory, removed again afterwards."""
    if where is not None:
        Path(where).mkdir(parents=True, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix="bench-ab-", dir=where))
    path = parent / rev.short
    git(["worktree", "add", "--detach", "--quiet", str(path), rev.sha or "HEAD"], repo)
    try:
        if rev.sha is None:
            snapshot(repo, path)
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo,
                       capture_output=True, timeout=GIT_TIMEOUT_S)
        shutil.rmtree(parent, ignore_errors=True)


def snapshot(repo: Path, tree: Path) -> None:
    """Makes `tree` (a worktree at HEAD) hold what `repo`'s working tree holds: its changes
    to tracked files and its untracked files that git does not ignore."""
    diff = git(["diff", "HEAD", "--binary"], repo)
    if diff.strip():
        try:
            subprocess.run(["git", "apply", "--whitespace=nowarn"], cwd=tree, input=diff,
                           text=True, check=True, capture_output=True, timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            raise RevisionError(f"could not snapshot the working tree: {e}") from None
    for name in git(["ls-files", "--others", "--exclude-standard", "-z"], repo).split("\0"):
        src = repo / name
        # Not the snapshots themselves (an --out inside the tree), nor nested repositories.
        if name and src.is_file() and tree.parent.resolve() not in src.resolve().parents:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)


def commits_between(good: Revision, bad: Revision, repo: Path) -> list[str]:
    """The commits after `good` up to and including `bad`, oldest first, along the first
    parents (the order in which they landed)."""
    if good.sha is None or bad.sha is None:
        raise RevisionError(f"bisect needs two commits, not {WORKTREE}")
    try:
        git(["merge-base", "--is-ancestor", good.sha, bad.sha], repo)
    except RevisionError:
        raise RevisionError(f"{good.label} is not an ancestor of {bad.label}") from None
    out = git(["rev-list", "--first-parent", "--reverse", f"{good.sha}..{bad.sha}"], repo)
    return out.split()


def subject(sha: str, repo: Path) -> str:
    return git(["log", "-1", "--format=%s", sha], repo).strip()
