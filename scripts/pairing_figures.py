"""Usage: python scripts/pairing_figures.py RUN_DIR [RUN_DIR...] [--ref P] [--policy POLICY]

What each serve design resolved, from runs' steps.csv (bench.analysis.paired): per run and
policy, every protocol against the reference (--ref, default the run's first protocol):
the step-time ratio paired by repeat [95% t interval] and its half-width, the same after
re-pairing the serves at random (duet benchmarking's control: where pairing in time
cancels bursts, re-pairing widens the interval), and, where the two schedules are one
(pinned, decide-alike), the extra ms per step with steps paired by index. For a
step-paired run (--pairing step): the design's ratio and extra ms per polling step
(paired.twin_ratio, twin_delta; the reference's own cells, twinned with themselves, are its
A/A), and in the "repaired" columns the same run's whole serves paired by repeat. One line
per row, then a markdown table (for docs/results).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.analysis import paired  # noqa: E402
from bench.report.printer import markdown_table  # noqa: E402
from bench.rundir.rundir import RunDir  # noqa: E402


def _fmt(iv) -> str:
    if iv.point is None:
        return "-"
    if iv.low is None:
        return f"{iv.point:.3f} [no CI]"
    return f"{iv.point:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def _half(iv) -> str:
    return "-" if iv.half_width is None else f"{100 * iv.half_width:.1f} %"


def rows(run_dir: Path, ref: str | None, only: str | None) -> list[dict]:
    run = RunDir(run_dir)
    steps, plan = run.steps(), run.plan() or {}
    env = run.env(optional=True) or {}
    protocols = list(dict.fromkeys(steps["protocol"]))
    ref = ref or (plan.get("protocols") or protocols)[0]
    n = env.get("neighbour") or {}
    out = []
    for policy in dict.fromkeys(steps["policy"]):
        if only and policy != only:
            continue
        for proto in (p for p in protocols if p != ref):
            if plan.get("pairing") == "step":
                out.append(_step_row(run, steps, n, policy, ref, proto))
                continue
            ratio = paired.step_ratio(steps, ref, proto, policy)
            again = paired.repaired_ratio(steps, ref, proto, policy)
            try:
                delta = paired.step_delta(steps, ref, proto, policy)
                d = "-" if delta.point is None else (
                    f"{delta.point:+.2f} [{delta.low:+.2f}, {delta.high:+.2f}]"
                    if delta.low is not None else f"{delta.point:+.2f}")
            except paired.PairingError:
                d = "schedules differ"
            out.append({"run": run.path.name, "pairing": plan.get("pairing") or "serial",
                        "neighbour": n.get("spec", "none"),
                        "neighbour_share": n.get("cpu_share_measured"),
                        "policy": policy, "pair": f"{proto}/{ref}", "repeats": ratio.n,
                        "step_ratio": _fmt(ratio), "half_width": _half(ratio),
                        "repaired_ratio": _fmt(again), "repaired_half_width": _half(again),
                        "extra_ms_per_polling_step": d})
    return out


def _step_row(run: RunDir, steps, n: dict, policy: str, ref: str, proto: str) -> dict:
    """A step-paired run: the design's own ratio and extra ms (steps paired within the
    step), beside the whole serves' ratio of the same run (cells paired by repeat)."""
    design, whole = paired.twin_ratio(steps, proto, policy), \
        paired.step_ratio(steps, ref, proto, policy)
    delta, aa = paired.twin_delta(steps, proto, policy), paired.twin_delta(steps, ref, policy)
    return {"run": run.path.name, "pairing": "step", "neighbour": n.get("spec", "none"),
            "neighbour_share": n.get("cpu_share_measured"), "policy": policy,
            "pair": f"{proto}/{ref}", "repeats": design.n, "step_ratio": _fmt(design),
            "half_width": _half(design),
            "repaired_ratio": f"whole serves: {_fmt(whole)}",
            "repaired_half_width": _half(whole),
            "extra_ms_per_polling_step": f"{_fmt(delta)}; A/A {_fmt(aa)}"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--ref")
    p.add_argument("--policy")
    a = p.parse_args(argv)
    table = []
    for r in a.runs:
        if not RunDir(r).has("steps"):
            print(f"pairing_figures: {r}: no steps.csv", file=sys.stderr)
            return 2
        table += rows(r, a.ref, a.policy)
    for row in table:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    cols = list(table[0]) if table else []
    print()
    print(markdown_table(cols, [[str(row[c]) for c in cols] for row in table]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
