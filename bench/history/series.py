"""One machine's kept results in commit order, cut into one series per gated metric and
configuration (protocol/policy), each commit's ratio B/A on a log scale with the standard
error its interval implies, chained across re-recorded baselines.

Order: git's first-parent order of the branch where the repository is at hand and holds
every kept commit; else the results' `created` time. Chaining: a gate's ratio is against
the baseline revision A of its day; when A moves to a commit C the history kept, C's own
ratio (against the old A) carries the later ones onto the old A's scale (its variance
added), so one series reads against the oldest kept baseline throughout. A new A the
history never gated starts a new epoch: the rules never compare across epochs."""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

GIT_TIMEOUT_S = 60


@dataclass
class Point:
    """One commit's check of one series: B/A and its interval as the gate wrote them; `y`
    and `var` on the chained log scale (var None: no interval); `epoch` as above."""

    index: int
    commit: str
    created: str
    ratio: float
    low: float | None
    high: float | None
    verdict: str
    threshold: float
    a_commit: str | None
    y: float = 0.0
    var: float | None = None
    epoch: int = 0


@dataclass
class Series:
    machine: str
    metric: str
    protocol: str
    policy: str
    threshold: float
    points: list[Point]

    @property
    def name(self) -> str:
        return f"{self.metric} {self.protocol}/{self.policy}"

    @property
    def slug(self) -> str:
        return f"{self.machine}_{self.metric}_{self.protocol}_{self.policy}".replace("/", "-")


def git_lines(args: list[str], repo: Path) -> list[str] | None:
    """A git command's stdout lines in `repo`, None where git or the repository fails."""
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.split() if done.returncode == 0 else None


def first_parents(repo: Path | None, branch: str) -> list[str] | None:
    """The branch's first-parent commits, oldest first; None without git or the branch."""
    if repo is None:
        return None
    shas = git_lines(["rev-list", "--first-parent", branch, "--"], repo)
    return shas[::-1] if shas else None


def ordered(results: list[dict], repo: Path | None, branch: str) -> tuple[list[dict], str]:
    """`results` in commit order, and how they were ordered (for the page)."""
    chain = first_parents(repo, branch)
    if chain:
        where = {sha: i for i, sha in enumerate(chain)}
        pos = [_position(r["_commit"], where, chain) for r in results]
        if all(p is not None for p in pos):
            return ([r for _, r in sorted(zip(pos, results, strict=True), key=lambda x: x[0])],
                    f"git's first-parent order of {branch}")
        off = sum(p is None for p in pos)
        why = f"{off} of {len(results)} commits are not on {branch}'s first parents"
    else:
        why = "no git repository with that branch at hand"
    return sorted(results, key=lambda r: str(r["created"])), f"created time ({why})"


def _position(commit: str, where: dict[str, int], chain: list[str]) -> int | None:
    if commit in where:
        return where[commit]
    hits = [i for i, sha in enumerate(chain) if sha.startswith(commit)] if len(commit) >= 7 \
        else []
    return hits[0] if len(hits) == 1 else None


def z_of(level: float) -> float:
    """The normal quantile of a two-sided interval at `level` (0.95 -> 1.96)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


def build(machine: str, results: list[dict], level: float) -> list[Series]:
    """One series per (metric, protocol, policy) found in the ordered results, chained."""
    z = z_of(level)
    table: dict[tuple, Series] = {}
    for i, r in enumerate(results):
        for m in r["metrics"]:
            if m["ratio"] is None:
                continue  # NOT JUDGED / REFUSED without a ratio: nothing to draw
            key = (m["metric"], m["protocol"], m["policy"])
            s = table.setdefault(key, Series(machine, *key, float(m["threshold"]), []))
            p = Point(i, r["_commit"], str(r["created"]), float(m["ratio"]), m["low"],
                      m["high"], m["verdict"], float(m["threshold"]), r["a"].get("commit"))
            p.y = math.log(p.ratio)
            if p.low is not None and p.high is not None and p.high > p.low:
                p.var = ((math.log(p.high) - math.log(p.low)) / (2 * z)) ** 2
            s.points.append(p)
    for s in table.values():
        chain(s.points)
    return list(table.values())


def chain(points: list[Point]) -> None:
    """Put every point on the scale of its epoch's first baseline revision (module doc)."""
    seen: dict[str, Point] = {}
    a, offset, offvar, epoch = None, 0.0, 0.0, 0
    for p in points:
        if a is not None and p.a_commit != a:
            link = _find(seen, p.a_commit)
            if link is not None and link.epoch == epoch and link.var is not None:
                offset, offvar = link.y, link.var  # the new A's own ratio against the old A
            else:
                epoch, offset, offvar = epoch + 1, 0.0, 0.0
        a = p.a_commit
        p.y += offset
        p.var = None if p.var is None else p.var + offvar
        p.epoch = epoch
        seen[p.commit] = p


def _find(seen: dict[str, Point], commit: str | None) -> Point | None:
    if commit is None:
        return None
    if commit in seen:
        return seen[commit]
    hits = [p for c, p in seen.items() if c.startswith(commit) or commit.startswith(c)]
    return hits[-1] if len(hits) == 1 else None
