"""decision.json: the verdict of a gate or a review, for scripts (never the console lines).

`bench gate RUN --ab` writes RUN/ab/decision.json; `bench review` writes one beside its page.
The API, all of it:
- `Decision` (with `Side`, `Disturbance`, `Exact`, `Metric`): frozen dataclasses, one field a
  key of the file; `Decision.exit_code` and `Decision.verdict` are what
  bench.verdict.words.overall says (the words, their order and their exit codes are there).
- `Disturbance.measured(cpu_lost)` / `.from_ranks(tables)`: the serves' cpu_lost (ranks.csv).
- `write(decision, folder)` (atomic) and `read(path)`: ResultFileError, one line, for a
  missing or foreign file and for a schema newer than SCHEMA.
The schema, key by key: docs/gate-ci.md; the rule: bench.gate.timing.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from bench.rundir.files import ResultFileError, read_json_object, write_json_atomic
from bench.rundir.rundir import FILES
from bench.rundir.schema import DISTURBED_LIMIT

SCHEMA = 1
FILE = FILES["decision"]
KINDS = ("gate", "review")


@dataclass(frozen=True)
class Side:
    """One revision of the decision: A the baseline (a review's base), B the change."""

    label: str
    commit: str | None = None
    spec: str | None = None


@dataclass(frozen=True)
class Disturbance:
    """How much CPU time the serves lost to steal and other processes (ranks.csv cpu_lost,
    a share of cores x wall time), and whether that is quiet: p50 at most `quiet_limit`,
    a limit fixed in advance (bench.rundir.schema.DISTURBED_LIMIT), never read from timings.
    Unmeasured (no ranks.csv, not Linux): p50 None, and quiet: no excuse without a measure."""

    cpu_lost_p50: float | None
    cpu_lost_p90: float | None
    quiet: bool
    quiet_limit: float = DISTURBED_LIMIT

    @classmethod
    def measured(cls, cpu_lost: Iterable[float], limit: float = DISTURBED_LIMIT
                 ) -> Disturbance:
        values = sorted(float(x) for x in cpu_lost if x is not None and math.isfinite(x))
        if not values:
            return cls(None, None, True, limit)
        p50, p90 = _quantile(values, 0.5), _quantile(values, 0.9)
        return cls(round(p50, 4), round(p90, 4), p50 <= limit, limit)

    @classmethod
    def from_ranks(cls, tables: Iterable) -> Disturbance:
        """`measured` over ranks.csv tables (None: none written): rank 0's row per serve."""
        lost: list[float] = []
        for ranks in tables:
            if ranks is None or "cpu_lost" not in ranks:
                continue
            serves = ranks[ranks["rank"] == 0] if "rank" in ranks else ranks
            lost += [float(x) for x in serves["cpu_lost"] if _number(x)]
        return cls.measured(lost)

    def line(self) -> str:
        """`cpu lost p50 1.2% (quiet, limit 5%)`, or that it was not measured."""
        if self.cpu_lost_p50 is None:
            return "cpu lost not measured, taken as quiet"
        state = "quiet" if self.quiet else "disturbed"
        return f"cpu lost p50 {self.cpu_lost_p50:.1%} ({state}, limit {self.quiet_limit:.0%})"


def _number(x: object) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    at = q * (len(values) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (at - lo)


@dataclass(frozen=True)
class Exact:
    """The exact (count and correctness) checks: how many, how many failed."""

    checks: int
    failed: int


@dataclass(frozen=True)
class Metric:
    """One timing check: a configuration's ratio B/A of one metric and its verdict."""

    metric: str
    protocol: str
    policy: str
    layout: str
    ratio: float | None
    low: float | None
    high: float | None
    half_width: float | None  # a fraction; None without an interval
    needed_half_width: float | None  # what would have decided it; None when decided
    threshold: float
    verdict: str
    pairs: int
    note: str = ""


@dataclass(frozen=True)
class Decision:
    """The whole file (docs/gate-ci.md); `schema` last so that it defaults to SCHEMA."""

    kind: str
    verdict: str
    exit_code: int
    created: str
    host: str
    cores: int | None
    commit: str | None
    dirty: bool | None
    branch: str | None
    a: Side
    b: Side
    preset: str | None
    schedule: str | None
    protocols: list[str]
    policies: list[str]
    thresholds: dict[str, float]
    estimator: str
    level: float
    pairs: int
    pairs_kept: int
    seconds: float | None
    disturbance: Disturbance
    exact: Exact
    metrics: list[Metric]
    # a review's: the sides after B, each timing stage (folder, exit, repeats, seed,
    # seconds), and the hazard cells a side refused before serving (a line each)
    others: list[Side] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    schema: int = SCHEMA


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write(decision: Decision, folder: Path) -> Path:
    """folder/decision.json, written atomically (the folder made where need be); its path."""
    path = Path(folder) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, asdict(decision))
    return path


def read(path: Path) -> Decision:
    """A decision.json (or the folder holding one); ResultFileError, one line, when it is
    missing, not a decision, or of a newer schema than this bench reads."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    where = path.parent
    if not path.is_file():
        raise ResultFileError(f"{path}: no decision.json (a gate --ab or a review writes one)")
    obj = read_json_object(path)
    schema = obj.get("schema")
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA:
        raise ResultFileError(f"{where}/{FILE}: schema {schema} is newer than this bench reads "
                              f"({SCHEMA}): update hicache-bench")
    if schema != SCHEMA or obj.get("kind") not in KINDS:
        raise ResultFileError(f"{path}: not a gate's or a review's decision (schema "
                              f"{schema!r}, kind {obj.get('kind')!r})")
    try:
        return _decision(obj)
    except (TypeError, KeyError, AttributeError) as e:
        raise ResultFileError(f"{path}: a decision with missing or unknown keys ({e})") from None


def _decision(obj: dict) -> Decision:
    nested = {"a": Side, "b": Side, "disturbance": Disturbance, "exact": Exact}
    optional = {"others", "stages", "refused"}
    kw = {f.name: obj[f.name] for f in fields(Decision)
          if f.name not in optional or f.name in obj}
    kw |= {k: cls(**obj[k]) for k, cls in nested.items()}
    kw["metrics"] = [Metric(**m) for m in obj["metrics"]]
    kw["others"] = [Side(**x) for x in obj.get("others", [])]
    return Decision(**kw)
