"""What `bench gate` prints (bench.commands.gate): the failing checks, each on a line with
its expected, observed and meaning below it, or a result per check when none fails; the
notes and resolution lines; the last line, OK or FAILED with each timing metric's state
(scripts/gate_power.py reads it). No line wider than a terminal (bench.tables.WIDTH)."""

from __future__ import annotations

from bench.gate.checks import Check, state
from bench.gate.timing import AB_METRICS, resolution_lines
from bench.tables import WIDTH, fit, fixed_width, wrapped


def _why(checks: list[Check]) -> str:
    """The reasons checks were not judged, each once."""
    return "; ".join(dict.fromkeys(c.note.removeprefix("not judged: ") for c in checks))


def _result(checks: list[Check]) -> str:
    """PASS, UNRESOLVED, NOT JUDGED (why), or several with their counts, for one check's
    rows (none of them failing)."""
    idle = [c for c in checks if not c.judged]
    if len(idle) == len(checks):
        return f"NOT JUDGED ({_why(idle)})"
    if not idle:
        return "PASS"
    return f"PASS {len(checks) - len(idle)}, NOT JUDGED {len(idle)} ({_why(idle)})"


WORST = ("FAIL", "UNRESOLVED", "NOT JUDGED", "PASS")


def per_metric(checks: list[Check]) -> dict[str, str]:
    """Each timing metric's state over its configurations, the worst first (WORST)."""
    out: dict[str, str] = {}
    for c in checks:
        if c.resolves is None and c.judged:
            continue  # not a timing check
        metric = c.check.removesuffix("_ab").removesuffix("_ratio_vs_baseline")
        s = state(c)
        if metric not in out or WORST.index(s) < WORST.index(out[metric]):
            out[metric] = s
    order = list(AB_METRICS)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                       else len(order)))


def last_line(checks: list[Check]) -> str:
    """The gate's last line: OK or FAILED, then PASS / FAIL / UNRESOLVED / NOT JUDGED per
    timing metric (its worst configuration) and how the exact checks did. Where that is
    wider than a terminal (bench.tables.WIDTH: several metrics UNRESOLVED or not judged),
    the counts and the reasons go on a line of their own above it, and the last line is OK
    or FAILED with each metric's state alone."""
    failed = [c for c in checks if not c.passed]
    verdict = "OK" if not failed else "FAILED"
    head = "OK" if not failed else f"FAILED: {len(failed)} of {len(checks)} checks"
    timing = per_metric(checks)
    exact = [c for c in checks
             if c.check.removesuffix("_ab").removesuffix("_ratio_vs_baseline") not in timing]
    bad = sum(not c.passed for c in exact)
    counts = (f"{len(exact)} exact checks pass" if not bad
              else f"{bad} of {len(exact)} exact checks FAIL")
    if not timing:
        return f"{head}: {counts}"
    idle = [c for c in checks if not c.judged]
    why = f" ({_why(idle)})" if idle else ""
    states = ", ".join(f"{m} {s}{why if s == 'NOT JUDGED' else ''}" for m, s in timing.items())
    line = f"{head}: {states}; {counts}"
    if len(line) <= WIDTH:
        return line
    above = f"{head}; {counts}" + (f"; not judged: {_why(idle)}" if idle else "")
    return "\n".join([*wrapped([above]),
                      f"{verdict}: " + ", ".join(f"{m} {s}" for m, s in timing.items())])


def _details(c: Check) -> list[str]:
    """A failing (not judged, unresolved) check's expected, observed and meaning, each on
    its own indented line below the check's own, wrapped at a terminal's width."""
    meaning = f"not judged: {_why([c])}" if not c.judged else c.meaning
    return wrapped([f"  {name}: {text}" for name, text in (
        ("expected", c.expected), ("observed", c.observed), ("meaning", meaning)) if text])


def format_checks(checks: list[Check]) -> str:
    """Failing (not judged, unresolved) checks, each a line (check, protocol, policy,
    layout, state) with its expected, observed and meaning indented below; when none fail, a
    result per check; then the notes and each timing check's resolvable difference beside
    its threshold. No line wider than a terminal (bench.tables.WIDTH)."""
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
