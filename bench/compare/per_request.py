"""A run of SGLang's own code (`bench run --cache sglang`, protocol `sglang-0.5.23@unified`)
beside a run of the project's model of that release, or beside a run of another SGLang,
request by request: the two serve one workload per seed, so each request's counts pair
(docs/sglang.md, "bench run --cache sglang"). Each difference names both sides' call sites
(requests.csv `call_sites`)."""

from __future__ import annotations

import pandas as pd

from bench.rundir.schema import COUNT_COLUMNS
from hicache.spec.cost_model import modelled

REQUEST_KEYS = ["protocol", "policy", "repeat", "rid"]
SHOWN = 20  # differences listed in full; the rest are counted


def sglang_run(requests: pd.DataFrame) -> bool:
    """Whether the rows come from a --cache sglang run (a protocol `sglang-<release>@...`)."""
    return requests["protocol"].astype(str).str.contains("@").any()


def as_modelled(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows with each protocol named by the project protocol that models it, so a
    --cache sglang run's rows match a --cache project run's."""
    if frame is None:
        return None
    return frame.assign(protocol=frame["protocol"].astype(str).map(modelled))


def sides_pairing(a: pd.DataFrame, b: pd.DataFrame) -> tuple[dict, dict, str] | None:
    """Two runs of SGLang's own code whose protocols differ: how their rows pair, as
    (A's renames, B's renames, a note), or None where they pair as named or cannot:
    labelled sides (`LABEL=SPEC`) sharing their labels: by label; else one SGLang in each
    run: both as `sglang` (the before and after of a change, made as two runs)."""
    names_a, names_b = (sorted(f["protocol"].astype(str).unique()) for f in (a, b))
    if names_a == names_b:
        return None
    labels_a, labels_b = ({n: n.split("=", 1)[0] for n in names if "=" in n}
                          for names in (names_a, names_b))
    shared = set(labels_a.values()) & set(labels_b.values())
    if shared:
        pairs = sorted(f"{la} ({n})" for n, la in labels_a.items() if la in shared)
        return (labels_a, labels_b, f"note: SGLang sides paired by label: "
                f"{', '.join(pairs)} in A with B's sides of the same labels")
    if len(names_a) == 1 and len(names_b) == 1:
        return ({names_a[0]: "sglang"}, {names_b[0]: "sglang"},
                f"note: one SGLang in each run: A's {names_a[0]} paired with B's "
                f"{names_b[0]} as protocol `sglang`")
    return None


def differences(a: pd.DataFrame, b: pd.DataFrame) -> tuple[int, list[str]]:
    """(requests in both runs, one line per request whose counts differ: each count's A
    and B, and both sides' call sites)."""
    if any(k not in f for k in REQUEST_KEYS for f in (a, b)):
        return 0, ["per request: not compared (requests.csv lacks rid)"]
    both = a.merge(b, on=REQUEST_KEYS, suffixes=("_a", "_b"))
    lines = []
    for _, row in both.iterrows():
        diff = [f"{c} {row[c + '_a']} -> {row[c + '_b']}" for c in COUNT_COLUMNS
                if c + "_a" in row and row[c + "_a"] != row[c + "_b"]]
        if diff:
            lines.append(f"{row['policy']} repeat {row['repeat']} {row['rid']}: "
                         f"{', '.join(diff)}; A: {_sites(row, 'a')}; B: {_sites(row, 'b')}")
    return len(both), lines


def _sites(row: pd.Series, side: str) -> str:
    value = row.get(f"call_sites_{side}")
    return "none" if value is None or pd.isna(value) or value == "" else str(value)


def section(a: pd.DataFrame, b: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(the lines compare prints, the report's markdown section)."""
    n, lines = differences(a, b)
    head = f"per request: {n - len(lines)} of {n} requests equal in every count " \
        f"({', '.join(COUNT_COLUMNS)})"
    shown = lines[:SHOWN] + ([f"... and {len(lines) - SHOWN} more"] if len(lines) > SHOWN else [])
    md = ["## Per request", "", head, "", *(f"- {line}" for line in shown), ""]
    return [head, *shown], md
