"""Usage: python scripts/served_pairs.py OUT_DIR [--seconds 4200] [--repeats 12]
                                        [--plant-ref REF]

Data for scripts/estimators.py: served A/As of HEAD against itself the way the gate serves
(gate.json's `ab`: preset, schedule, protocols, policies), one beside bench.neighbour's
default neighbour (OUT_DIR/aa_neighbour) and one without (OUT_DIR/aa_plain), and, with
--plant-ref (a commit whose scheduler spins a share of each step, as scripts/gate_power.py
plants one), HEAD against it beside the neighbour (OUT_DIR/plant_neighbour). Stages of
--repeats pairs, one of each kind a round (seeds 0, 1, ...), until --seconds have passed;
each kind's ab.json is written after every stage, so a study cut short is readable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ab import served  # noqa: E402
from bench.ab.revisions import RevisionError, checked_out, resolve  # noqa: E402
from bench.gate.ab import _run_args  # noqa: E402
from bench.neighbour import DEFAULT, Neighbour, parse  # noqa: E402
from bench.rundir.files import write_json_atomic  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="served_pairs.py", description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=4200.0)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--plant-ref")
    args = ap.parse_args(argv)
    try:
        ab = json.loads((REPO / "results" / "baseline" / "gate.json").read_text())["ab"]
        head = resolve("HEAD", REPO)
        kinds = [("aa_neighbour", head, head, True), ("aa_plain", head, head, False)]
        if args.plant_ref:
            kinds.append(("plant_neighbour", head, resolve(args.plant_ref, REPO), True))
    except (OSError, KeyError, RevisionError) as e:
        print(f"served_pairs: {e}", file=sys.stderr)
        return 2
    stop = time.time() + args.seconds
    with contextlib.ExitStack() as stack:
        runs = []
        for name, a, b, nb in kinds:
            plan = served.ServedPlan(a, b, ab["preset"], args.repeats, run_args=_run_args(ab),
                                     out=args.out / name)
            plan.out.mkdir(parents=True, exist_ok=True)
            roots = {s: stack.enter_context(checked_out(rev, REPO, plan.out))
                     for s, rev in (("a", a), ("b", b))}
            runs.append((plan, roots, nb, []))
        r = 0
        while time.time() < stop:
            for plan, roots, nb, stages in runs:
                if time.time() < stop:
                    stage(plan, roots, nb, stages, r)
            r += 1
    return 0


def stage(plan, roots, nb: bool, stages: list, index: int) -> None:
    """One stage of one kind, beside the neighbour when `nb`; ab.json rewritten."""
    with contextlib.ExitStack() as stack:
        planted = stack.enter_context(Neighbour(parse(DEFAULT))) if nb else None
        try:
            stages.append(served.serve_stage(plan, roots, index, index, plan.repeats, print))
        except Exception as e:  # one failed stage: the other kinds go on
            print(f"{plan.out.name} stage {index} failed: {e}", flush=True)
            return
    if planted is not None:
        write_json_atomic(stages[-1].dirs["a"].parent / "neighbour.json", planted.record())
    write_json_atomic(plan.out / "ab.json",
                      served.record(plan, stages) | {"neighbour": DEFAULT if nb else None})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
