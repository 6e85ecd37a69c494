"""`bench history DIR`'s page: per machine, its figures (bench.history.figures), the steps
and creep the rules found (bench.history.rules) with the command that confirms each, the
baseline advice (bench.history.advice), and the newest commits' verdicts, in history.md."""

from __future__ import annotations

import datetime as dt
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.history import advice, figures, series, store
from bench.history.rules import Finding, Rules, creeps, steps
from bench.report.printer import command_lines
from bench.rundir.files import write_text_atomic

NEWEST_ROWS = 30


@dataclass(frozen=True)
class PageOptions:
    path: Path
    out: Path
    machine: str | None = None
    repo: Path | None = None
    branch: str | None = None
    rules: Rules = Rules()
    stale: int = advice.STALE
    figures: bool = True  # False: the page without its PNGs (links left out)


@dataclass
class Outcome:
    page: Path
    lines: list[str] = field(default_factory=list)  # what the verb prints
    steps: list[Finding] = field(default_factory=list)
    creeps: list[Finding] = field(default_factory=list)


def render(opts: PageOptions) -> Outcome:
    """Read the history, apply the rules, draw the figures, write OUT/history.md."""
    hist = store.load(opts.path, opts.machine)
    opts.out.mkdir(parents=True, exist_ok=True)
    done = Outcome(opts.out / "history.md")
    s = hist.settings
    md = [f"# Gate history: {opts.path}", "",
          f"Kind {hist.kind}, preset {s.get('preset')}, schedule {s.get('schedule')}, "
          f"{s.get('estimator')} intervals at {s.get('level')}; thresholds: "
          + ", ".join(f"{k} {v:g}" for k, v in (s.get("thresholds") or {}).items()) + ".",
          f"Written {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ} by `python -m bench "
          f"history {opts.path}`; rules: docs/history.md (window {opts.rules.window}, "
          f"step beyond {opts.rules.min_step:.1%}, creep above "
          f"{opts.rules.creep_threshold:.0%}, alpha {opts.rules.alpha:g} per rule and "
          "machine).", ""]
    for machine, results in hist.machines.items():
        md += _machine(machine, results, hist, opts, done)
    write_text_atomic(done.page, "\n".join(md) + "\n")
    done.lines.append(f"history: {done.page}: {len(done.steps)} step(s), "
                      f"{len(done.creeps)} creep(s)")
    return done


def _machine(machine: str, results: list[dict], hist: store.History, opts: PageOptions,
             done: Outcome) -> list[str]:
    branch = opts.branch or _branch(results)
    results, how = series.ordered(results, opts.repo, branch)
    level = float(hist.settings.get("level") or 0.95)
    all_series = series.build(machine, results, level)
    found_steps, found_creeps = steps(all_series, opts.rules), creeps(all_series, opts.rules)
    done.steps += found_steps
    done.creeps += found_creeps
    labels = [r["_commit"][:8] for r in results]
    pngs = [figures.draw(s, labels, found_steps, opts.rules, opts.out / f"{s.slug}.png")
            for s in all_series] if opts.figures else []
    verdicts = Counter(r["verdict"] for r in results)
    md = [f"## {machine}", "",
          f"{len(results)} commits, {results[0]['_commit'][:10]} ({results[0]['created']}) to "
          f"{results[-1]['_commit'][:10]} ({results[-1]['created']}), in {how}. Gates: "
          + ", ".join(f"{n} {v}" for v, n in verdicts.most_common()) + ".", ""]
    md += _step_lines(found_steps, hist.settings, results, opts.repo, done)
    md += _creep_lines(found_creeps, done)
    md += _baseline_lines(results, opts, done)
    if pngs:
        md += ["### Figures", ""] + [f"![{s.name}]({p.name})"
                                      for s, p in zip(all_series, pngs, strict=True)] + [""]
    return md + _newest(results)


def _branch(results: list[dict]) -> str:
    named = [r.get("branch") for r in results if r.get("branch")]
    return Counter(named).most_common(1)[0][0] if named else "HEAD"


def _step_lines(found: list[Finding], settings: dict, results: list[dict],
                repo: Path | None, done: Outcome) -> list[str]:
    md = ["### Steps", ""]
    if not found:
        return md + ["None found.", ""]
    protocols = results[-1].get("protocols") or []
    policies = results[-1].get("policies") or []
    md += ["| first commit after | subject | check | change [interval] | confirm with |",
           "|---|---|---|---|---|"]
    for f in found:
        cmd = advice.bisect_command(f, settings, protocols, policies)
        md.append(f"| {f.commit[:10]} | {_subject(repo, f.commit)} | {f.series.name} | "
                  f"{_change(f)} | {f'`{cmd}`' if cmd else 'faster: nothing to bisect'} |")
        done.lines.append(f"history: {f.series.machine}: step {_change(f)} in {f.series.name} "
                          f"at {f.commit[:10]}" + ("; confirm with:" if cmd else ""))
        done.lines += command_lines(cmd) if cmd else []
    return md + [""]


def _creep_lines(found: list[Finding], done: Outcome) -> list[str]:
    md = ["### Creep", ""]
    if not found:
        return md + ["None found.", ""]
    md += ["| check | from | to | drift [interval] | gates, all PASS |", "|---|---|---|---|---|"]
    for f in found:
        md.append(f"| {f.series.name} | {f.before[:10]} | {f.commit[:10]} | {_change(f)} | "
                  f"{f.commits} |")
        done.lines.append(f"history: {f.series.machine}: creep {_change(f)} in "
                          f"{f.series.name} from {f.before[:10]} to {f.commit[:10]}, "
                          f"{f.commits} gates each PASS")
    return md + [""]


def _baseline_lines(results: list[dict], opts: PageOptions, done: Outcome) -> list[str]:
    a = results[-1]["a"].get("commit") or "unknown"
    tip = advice.rebaseline(results, opts.repo, opts.stale)
    if tip is None:
        return ["### Baseline", "", f"The newest gate ran against {a[:10]}: no re-recording "
                f"asked for (it is fewer than {opts.stale} commits old, a gate since FAILed, "
                "or none since PASSed).", ""]
    age = (f"{tip.since} commits" if tip.since is not None
           else f"older than every kept commit (at least {tip.gates} commits)")
    done.lines.append(f"history: re-record the baseline at {tip.commit[:10]}:")
    done.lines += command_lines(tip.command)
    return ["### Baseline", "",
            f"The baseline revision {a[:10]} is {age} old and none of the {tip.gates} gates "
            f"since it FAILed ({tip.passed} PASS): their drift was accepted. Re-record it at "
            f"{tip.commit[:10]} (the newest quiet PASS), on a clean tree, then commit "
            "results/baseline/:", "",
            f"    {tip.command}", ""]


def _change(f: Finding) -> str:
    return f"{f.change:+.1%} [{f.low:+.1%}, {f.high:+.1%}]"


def _subject(repo: Path | None, commit: str) -> str:
    if repo is None:
        return ""
    try:
        done = subprocess.run(["git", "log", "-1", "--format=%s", commit], cwd=repo,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()[:60].replace("|", "/") if done.returncode == 0 else ""


def _newest(results: list[dict]) -> list[str]:
    md = [f"### The newest {min(NEWEST_ROWS, len(results))} commits", "",
          "| commit | created | baseline | verdict | checks not PASS | cpu lost p50 |",
          "|---|---|---|---|---|---|"]
    for r in results[::-1][:NEWEST_ROWS]:
        bad = [f"{m['metric']} {m['protocol']} {m['verdict']}" for m in r["metrics"]
               if m["verdict"] != "PASS"]
        lost = (r.get("disturbance") or {}).get("cpu_lost_p50")
        md.append(f"| {r['_commit'][:10]} | {r['created']} | {(r['a'].get('commit') or '-')[:10]}"
                  f" | {r['verdict']} | {', '.join(bad) or '-'} | "
                  f"{'-' if lost is None else f'{lost:.1%}'} |")
    return md + [""]
