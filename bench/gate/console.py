"""What `bench gate` prints (bench.commands.gate): the failing checks, each on a line with
its expected, observed and meaning below it, or a result per check when none fails; the
notes and resolution lines; the last line, OK, FAILED or INCONCLUSIVE with each timing
metric's verdict, the disturbance measured and each undecided check's half-width against the
one it needed. Scripts read decision.json, never these lines. No line wider than a terminal
(bench.report.printer.WIDTH)."""

from __future__ import annotations

from bench.ab.served import AB_METRICS
from bench.gate.outcome import metric_name
from bench.gate.timing import resolution_lines
from bench.report.printer import WIDTH, fit, fixed_width, wrapped
from bench.rundir.decision import Disturbance
from bench.verdict.checks import Check, is_timing, state, verdict_of


def _why(checks: list[Check]) -> str:
    """The reasons checks were not judged, each once."""
    return "; ".join(dict.fromkeys(c.note.removeprefix("not judged: ") for c in checks))


def _result(checks: list[Check]) -> str:
    """PASS, NOT JUDGED (why), or several with their counts, for one check's
    rows (none of them failing)."""
    idle = [c for c in checks if not c.judged]
    if len(idle) == len(checks):
        return f"NOT JUDGED ({_why(idle)})"
    if not idle:
        return "PASS"
    return f"PASS {len(checks) - len(idle)}, NOT JUDGED {len(idle)} ({_why(idle)})"


WORST = ("FAIL", "INCONCLUSIVE", "NOT JUDGED", "PASS")
HEADS = {"PASS": "OK", "FAIL": "FAILED", "INCONCLUSIVE": "INCONCLUSIVE"}


def per_metric(checks: list[Check]) -> dict[str, str]:
    """Each timing metric's verdict over its configurations, the worst first (WORST)."""
    out: dict[str, str] = {}
    for c in checks:
        if not is_timing(c):
            continue
        metric, s = metric_name(c), state(c)
        if metric not in out or WORST.index(s) < WORST.index(out[metric]):
            out[metric] = s
    order = list(AB_METRICS)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                       else len(order)))


def _undecided(checks: list[Check]) -> list[str]:
    """Per check undecided at the end: the half-width it reached against the one it needed."""
    return [f"{metric_name(c)} {c.protocol}/{c.policy} {c.resolves:.1%} (needed "
            f"{c.needed:.1%})"
            for c in checks if c.unresolved and c.needed is not None]


def _short(d: Disturbance | None) -> str:
    if d is None:
        return ""
    if d.cpu_lost_p50 is None:
        return "cpu lost not measured"
    return f"cpu lost {d.cpu_lost_p50:.1%} ({'quiet' if d.quiet else 'noisy'})"


def _reached(checks: list[Check], metric: str) -> str:
    """` (4.1% vs 2.0%)`: the half-width a metric's farthest undecided check reached against
    the one it needed; "" when every check of it decided."""
    open_ = [c for c in checks if c.unresolved and c.needed and metric_name(c) == metric]
    if not open_:
        return ""
    c = max(open_, key=lambda c: c.resolves / c.needed)
    return f" ({c.resolves:.1%} vs {c.needed:.1%})"


def _grouped(checks: list[Check], timing: dict[str, str], head: str) -> str:
    """The metrics grouped by verdict, the worst first, each undecided one with `_reached`;
    the head left out where the first group already says it."""
    groups = {s: [m for m, x in timing.items() if x == s] for s in WORST}
    text = "; ".join(f"{s} " + ", ".join(m + _reached(checks, m) for m in ms)
                     for s, ms in groups.items() if ms)
    return text if text.startswith(head.replace("FAILED", "FAIL") + " ") else f"{head}: {text}"


def last_line(checks: list[Check], disturbance: Disturbance | None = None) -> str:
    """The gate's last line: OK, FAILED or INCONCLUSIVE, each timing metric's verdict (its
    worst configuration), the disturbance measured (serves' cpu_lost p50), each undecided
    check's half-width reached against the one it needed, and how the exact checks did.
    Where that is wider than a terminal (bench.report.printer.WIDTH), the counts, the reasons and
    every undecided check go on lines of their own above it, and the last line keeps each
    metric's verdict (grouped by verdict where need be), the disturbance and, where they
    fit, the half-widths of each metric's farthest undecided check."""
    verdict = verdict_of(checks)
    failed = [c for c in checks if not c.passed]
    head = HEADS[verdict] + ("" if verdict == "PASS" else f": {len(failed)} of {len(checks)} "
                             "checks")
    timing = per_metric(checks)
    exact = [c for c in checks if not is_timing(c)]
    bad = sum(not c.passed for c in exact)
    counts = (f"{len(exact)} exact checks pass" if not bad
              else f"{bad} of {len(exact)} exact checks FAIL")
    if not timing:
        return f"{head}: {counts}"
    idle = [c for c in checks if not c.judged]
    why = f" ({_why(idle)})" if idle else ""
    states = ", ".join(f"{m} {s}{why if s == 'NOT JUDGED' else ''}" for m, s in timing.items())
    undecided = _undecided(checks)
    dist = [_short(disturbance)] if disturbance is not None else []
    told = dist + (["undecided: " + ", ".join(undecided)] if undecided else [])
    line = "; ".join([f"{head}: {states}", *told, counts])
    if len(line) <= WIDTH:
        return line
    above = [f"{head}; {counts}" + (f"; not judged: {_why(idle)}" if idle else "")]
    above += ["undecided: " + "; ".join(undecided)] if undecided else []
    word = HEADS[verdict]
    tries = [f"{word}: " + ", ".join(f"{m} {s}{_reached(checks, m)}" for m, s in timing.items()),
             _grouped(checks, timing, word),
             f"{word}: " + "; ".join(f"{s} {', '.join(m for m, x in timing.items() if x == s)}"
                                     for s in WORST if s in timing.values())]
    last = next((t for t in tries if len("; ".join([t, *dist])) <= WIDTH), tries[-1])
    return "\n".join([*wrapped(above), "; ".join([last, *dist])])


def _details(c: Check) -> list[str]:
    """A failing (not judged, undecided) check's expected, observed and meaning, each on
    its own indented line below the check's own, wrapped at a terminal's width."""
    meaning = f"not judged: {_why([c])}" if not c.judged else c.meaning
    return wrapped([f"  {name}: {text}" for name, text in (
        ("expected", c.expected), ("observed", c.observed), ("meaning", meaning)) if text])


def format_checks(checks: list[Check]) -> str:
    """Failing (not judged, undecided) checks, each a line (check, protocol, policy,
    layout, state) with its expected, observed and meaning indented below; when none fail, a
    result per check; then the notes and each timing check's resolvable difference beside
    its threshold. No line wider than a terminal (bench.report.printer.WIDTH)."""
    failing = [c for c in checks if not c.passed]
    if failing:
        shown = [c for c in checks if not c.passed or not c.judged or c.unresolved]
        table = fixed_width(["check", "protocol", "policy", "layout", "state"],
                            [[c.check, c.protocol, c.policy, c.layout, state(c)] for c in shown])
        lines = wrapped(table[:1])
        for row, c in zip(table[1:], shown, strict=True):
            lines += wrapped([row]) + _details(c)
    else:
        names = list(dict.fromkeys(c.check for c in checks))
        lines = wrapped(fixed_width(["check", "rows", "result"], [
            [n, str(sum(c.check == n for c in checks)),
             _result([c for c in checks if c.check == n])] for n in names]))
    notes = [f"note: {c.check} {c.protocol}/{c.policy} ({c.layout}):\n  {c.note}"
             + (f"\n  observed: {c.observed}" if c.observed else "") for c in checks if c.note]
    return fit(*lines, *notes, *resolution_lines(checks))
