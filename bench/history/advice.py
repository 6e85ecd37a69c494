"""What the page tells its reader to do: the `bench bisect` command that would confirm a
step, and when the baseline revision is old and every gate since it passed, the commit to
re-record the baseline at and the one command that does it (docs/testing.md, "A new
baseline"; bench.gate.baseline.update_baseline)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from bench.history.rules import Finding
from bench.history.series import git_lines

STALE = 10  # commits after the baseline revision that make it old


def bisect_command(step: Finding, settings: dict, protocols: list[str],
                   policies: list[str]) -> str | None:
    """`bench bisect` from the last commit before a slower step to the newest commit of its
    after-window, on the step's metric and configuration, its threshold half the step's
    lower bound (bisect calls a commit worse only when its whole interval lies above
    1 + threshold); None for a faster step (bisect looks for worse)."""
    if step.change <= 0:
        return None
    s = step.series
    threshold = max(0.005, math.floor(step.low / 2 * 200) / 200)
    parts = ["python -m bench bisect", step.before[:12], step.last[:12],
             f"--metric {s.metric}_ms", f"--config {s.protocol}/{s.policy}",
             f"--preset {settings.get('preset') or 'default'}", f"--threshold {threshold:g}"]
    if protocols:
        parts.append(f"--protocols {','.join(protocols)}")
    if policies:
        parts.append(f"--policies {','.join(policies)}")
    return " ".join(parts)


@dataclass
class Rebaseline:
    """Re-record the baseline at `commit`: the revision `a` is `since` commits old (None:
    older than every kept commit, `gates` of them against it) and none of the gates after
    it FAILed (`passed` of them PASSed; an INCONCLUSIVE one was let through too)."""

    commit: str
    a: str
    since: int | None
    gates: int
    passed: int
    command: str


def rebaseline(results: list[dict], repo: Path | None, stale: int = STALE) -> Rebaseline | None:
    """The advice to re-record the baseline (module doc), or None: the newest result's
    baseline revision is recent, a gate since it FAILed (its drift was not accepted), or no
    gate since it PASSed."""
    if not results or not results[-1]["a"].get("commit"):
        return None
    a = results[-1]["a"]["commit"]
    at = next((i for i, r in enumerate(results) if _same(r["_commit"], a)), None)
    after = results[at + 1:] if at is not None else [
        r for r in results if _same(r["a"].get("commit"), a)]
    since = (len(results) - 1 - at) if at is not None else _count(repo, a, results[-1])
    if (since if since is not None else len(after)) < stale or not after:
        return None  # without git, an unkept A is at least as old as the gates against it
    if any(r["verdict"] == "FAIL" for r in after):
        return None
    passed = [r for r in after if r["verdict"] == "PASS"
              and (r.get("disturbance") or {}).get("quiet", True)]
    if not passed:
        return None
    c = passed[-1]["_commit"]
    command = (f"git checkout {c[:12]} && python -m bench run --preset ci && "
               "python -m bench gate results/latest --update-baseline")
    return Rebaseline(c, a, since, len(after), sum(r["verdict"] == "PASS" for r in after),
                      command)


def _same(x: str | None, y: str | None) -> bool:
    return bool(x and y) and (x.startswith(y) or y.startswith(x))


def _count(repo: Path | None, a: str, newest: dict) -> int | None:
    """Commits from `a` to the newest result's commit by git, None without it."""
    if repo is None:
        return None
    out = git_lines(["rev-list", "--count", f"{a}..{newest['_commit']}"], repo)
    return int(out[0]) if out else None
