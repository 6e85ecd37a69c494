"""Which tests run where (docs/testing.md, "Tiers"): read by tests/conftest.py when pytest
selects, and by the Makefile (`python -m tests.tiers timed`) to hand the timed pass only its
own files, so it does not collect the whole suite to run a few of them. Imports nothing."""

from __future__ import annotations

import sys

# Out of `make test` unless asked for by name: pyproject's addopts leaves them out with -m,
# but pytest keeps only the last -m, so `pytest -m "not slow"` (make test-fast) would bring
# them back. A -m expression that names one of them (make sglang-check, make test-stats,
# make test-long, bench microbench) selects it as written.
OPT_IN = ("microbench", "sglang_matrix", "statistical", "long")

# The files whose tests time what they check (marker `timed`): `make test` runs them alone,
# after the others have run on pytest-xdist workers, so no other test's ranks share the
# cores with them. A test that only waits out a collective timeout and checks the failure
# is named within a slack of 10 s or more (test_faults, test_divergence, test_hazards,
# test_sglang_hazards) is not timed: a busy neighbour costs it milliseconds. Nor is
# test_race: its side-car window is 128 ms a request, far wider than a step on busy cores.
TIMED = {
    "test_gate_real": "real A/Bs judge step time and TTFT",
    "test_fidelity": "a pinned headline against a free run of its seed, on the wall clock",
    "test_step_pairing": "a planted spin must show in its side's host time",
    "test_duet": "both lanes must serve at the same time",
    "test_machine": "a run beside planted CPU burners must see them, and only them",
    "test_neighbour": "the planted neighbour's CPU share is measured",
}


def timed_paths() -> list[str]:
    return [f"tests/{stem}.py" for stem in TIMED]


if __name__ == "__main__":
    if sys.argv[1:] != ["timed"]:
        sys.exit("usage: python -m tests.tiers timed")
    print(" ".join(timed_paths()))
