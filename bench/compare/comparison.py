"""Two runs side by side: what a code change did to collective counts and timings (the
engine of `python -m bench compare`, whose usage text, bench.commands.compare, says how
rows are matched and judged)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from bench.compare.metrics import TIMING_METRICS, TimingMetric, counts
from bench.compare.per_request import as_modelled, sglang_run, sides_pairing
from bench.compare.per_request import section as per_request_section
from bench.compare.rows import TimingOptions, count_rows, timing_rows
from bench.run.plan import plan_differences
from bench.rundir.files import ResultFileError, clean_key
from bench.rundir.rundir import LEGACY_SCHEMA_VERSION, RunDir
from bench.rundir.schema import CONFIG_COLUMNS, GROUP_KEYS
from bench.verdict import run_rules
from bench.verdict.thresholds import DEFAULT_THRESHOLD
from bench.verdict.words import COMPARE_VERDICTS
from hicache.spec.cost_model import POLICIES, PROTOCOLS

RUN_LEVEL = ("preset", "world_size", "device", "backend", "seed")  # checked, warned or noted
EXTRA_KEYS = [c for c in [*CONFIG_COLUMNS, "model"] if c not in GROUP_KEYS + list(RUN_LEVEL)]
ENV_FACTS = {"host": ("host",), "CPU": ("cpu_model",), "CPU count": ("cpu_count",),
             "torch": ("versions", "torch"), "NCCL": ("versions", "nccl"),
             "device": ("world", "device"), "backend": ("backend",)}
DRIFT = ("the two runs were made at different times: drift between them (the machine's "
         "other load, its clock, its temperature) is not in these intervals; for a decision, "
         "run both revisions interleaved with `python -m bench ab REV_A REV_B`")


@dataclass(frozen=True)
class Run:
    """One run directory's env.json, requests.csv and steps.csv (None when absent), and
    ranks.csv where a served A/B passes it (its cpu_lost: bench.analysis.estimate)."""

    path: Path
    env: dict
    requests: pd.DataFrame
    steps: pd.DataFrame | None
    ranks: pd.DataFrame | None = None

    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def schema_version(self) -> object:
        return self.env.get("schema_version", LEGACY_SCHEMA_VERSION)

    def table(self, name: str) -> pd.DataFrame | None:
        return {"requests": self.requests, "steps": self.steps, "ranks": self.ranks}[name]

    def fact(self, *path: str) -> object:
        """env.json value at `path`, None when absent."""
        node: object = self.env
        for k in path:
            node = node.get(k) if isinstance(node, dict) else None
        return node

    def setting(self, name: str) -> object:
        """A run-level setting (preset, tp, pp): env.json's plan, else the requests' column."""
        value = self.fact("plan", name)
        if value is None and name in self.requests and len(self.requests):
            value = self.requests[name].iloc[0]
        return clean_key((value,))[0]


def load_run(path: Path) -> Run:
    """A run directory, checked: env.json, requests.csv (required), steps.csv (optional)."""
    run = RunDir(path).check_dir()
    env, requests = run.env(), run.requests("compare")
    if requests.empty:
        raise ResultFileError(f"{run.file('requests')}: no rows")
    return Run(path, env, requests, run.steps("compare", optional=True))


def stacked(parts: list[tuple[Path, int]], path: Path | None = None) -> Run:
    """Several runs of one plan, each (folder, its repeats), read as one Run whose repeat
    numbers continue from run to run (the stages of a sequential A/B). ranks.csv (each
    serve's cpu_lost) is kept where every run has it; the Run's `path` is the first run's
    folder unless given."""
    tables: dict[str, list[pd.DataFrame]] = {"requests": [], "steps": [], "ranks": []}
    runs = [load_run(folder) for folder, _ in parts]
    offset = 0
    for (folder, repeats), run in zip(parts, runs, strict=True):
        found = {"requests": run.requests, "steps": run.steps, "ranks": RunDir(folder).ranks()}
        for name, frame in found.items():
            if frame is not None and "repeat" in frame:
                tables[name].append(frame.assign(repeat=offset + frame["repeat"].astype(int)))
        offset += repeats
    both = {k: pd.concat(v, ignore_index=True) if len(v) == len(runs) else None
            for k, v in tables.items()}
    return Run(Path(path or parts[0][0]), runs[0].env, both["requests"], both["steps"],
               both["ranks"])


def check_comparable(a: Run, b: Run) -> None:
    """Raise ResultFileError (one line) when A and B cannot be compared row by row."""
    if a.schema_version != b.schema_version:
        raise ResultFileError(f"refused: result schema versions differ (A {a.schema_version}, "
                              f"B {b.schema_version}); rerun the older one")
    for name, what in (("preset", "presets"), ("tp", "layouts (tp)"), ("pp", "layouts (pp)")):
        va, vb = a.setting(name), b.setting(name)
        if va != vb:
            raise ResultFileError(f"refused: the runs have different {what}: A {va}, B {vb}")


def env_warnings(a: Run, b: Run) -> list[str]:
    """env.json facts that differ and make timings incomparable."""
    diffs = [f"{label} {a.fact(*p)} -> {b.fact(*p)}" for label, p in ENV_FACTS.items()
             if a.fact(*p) != b.fact(*p)]
    gpus = [[g.get("name") for g in (r.fact("gpu", "gpus") or [])] for r in (a, b)]
    if gpus[0] != gpus[1]:
        diffs.append(f"GPUs {gpus[0] or 'none'} -> {gpus[1] or 'none'}")
    return [f"warning: timings may not be comparable: {'; '.join(diffs)}"] if diffs else []


def verdict_warnings(a: Run, b: Run) -> list[str]:
    """A run whose own verdict (verdict.json) is FAILED: its counts and timings are suspect."""
    out = []
    for side, run in (("A", a), ("B", b)):
        v = run_rules.read(run.path)
        if v is not None and not v.ok:
            out.append(f"warning: run {side} did not pass its own checks: {v.line}")
    return out


def plan_notes(a: Run, b: Run) -> list[str]:
    """Plan settings that differ (what was changed on purpose, or explains one-sided rows)."""
    diffs = plan_differences(a.fact("plan"), b.fact("plan"), "->")
    return [f"note: plans differ: {'; '.join(diffs)}"] if diffs else []


def match_keys(a: Run, b: Run) -> list[str]:
    """GROUP_KEYS plus the other configuration columns both runs carry."""
    return GROUP_KEYS + [c for c in EXTRA_KEYS if c in a.requests and c in b.requests]


def _groups(frame: pd.DataFrame | None, keys: list[str], where: str) -> dict[tuple, pd.DataFrame]:
    if frame is None:
        return {}
    missing = [k for k in keys if k not in frame]
    if missing:
        raise ResultFileError(f"{where}: missing columns {', '.join(missing)}")
    return {clean_key(k): g for k, g in frame.groupby(keys, dropna=False, sort=False)}


def _keyed(frame: pd.DataFrame | None, keys: list[str], table: str) -> pd.DataFrame | None:
    """ranks.csv only where it carries every key (it is the served A/B's covariate, never
    required); the other tables as they are (a missing key is refused)."""
    if table == "ranks" and frame is not None and not all(k in frame for k in keys):
        return None
    return frame


@dataclass
class Comparison:
    """Everything compare prints and writes; `rows` feed the table, the CSV and compare.md."""

    a: Run
    b: Run
    keys: list[str]
    threshold: float
    rows: list[dict] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    verb: str = "compare"  # or "ab" (bench.ab.blocks): the final line and the report's title
    drift_note: str = ""  # what the intervals leave out (compare: drift between the runs)
    run_lines: list[str] = field(default_factory=list)  # where A and B came from (ab's own)
    sections: list[str] = field(default_factory=list)  # the report's extra sections (ab's)
    extra_columns: list[str] = field(default_factory=list)  # the CSV's, after ROW_COLUMNS
    extra_rows: list[dict] = field(default_factory=list)  # the CSV's only (ab's block runs)

    def tally(self) -> dict[str, int]:
        return {v: sum(r["verdict"] == v for r in self.rows) for v in COMPARE_VERDICTS}

    def final_line(self) -> str:
        t = self.tally()
        return f"{self.verb}: {t['better']} better, {t['worse']} worse, {t['same']} same"


def reported_metrics(a: Run, b: Run, names: list[str] | None) -> tuple[list, dict]:
    """Timing metrics to report (present in at least one run) and where each is present."""
    cols = {(s, t): None if run.table(t) is None else run.table(t).columns
            for s, run in (("a", a), ("b", b)) for t in ("requests", "steps")}
    present = {(s, m): m.present(cols[(s, m.table)]) for m in TIMING_METRICS for s in "ab"}
    shown = [m for m in TIMING_METRICS
             if (names is None or m.name in names) and (present[("a", m)] or present[("b", m)])
             and (not m.shown_if or any(m.shown_if in cols[(s, m.table)] for s in "ab"))]
    return shown, present


def _order(key: tuple) -> tuple:
    """Protocols and policies in cost_model order, then the other keys (numbers as numbers)."""
    def index(seq: tuple, v: object) -> int:
        return seq.index(v) if v in seq else len(seq)

    def cell(v: object) -> tuple:
        return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
    return (index(PROTOCOLS, key[0]), str(key[0]), index(POLICIES, key[1]), str(key[1]),
            *(cell(v) for v in key[2:]))


def _configs(groups: dict) -> str:
    return ", ".join(f"{k[0]}/{k[1]}" for k in sorted(groups, key=_order)) or "none"


def _pair_sides(a: Run, b: Run) -> tuple[Run, Run, list[str]]:
    """Two runs of SGLang's own code with their rows renamed so that they pair
    (sides_pairing), and what the header says of it: the pairing, and a warning where
    the two ran different data paths (their counts then differ by path, not by change)."""
    pairing = sides_pairing(a.requests, b.requests)
    notes = []
    if pairing is not None:
        ren_a, ren_b, note = pairing
        a, b = (replace(r, requests=_renamed(r.requests, ren), steps=_renamed(r.steps, ren),
                        ranks=_renamed(r.ranks, ren)) for r, ren in ((a, ren_a), (b, ren_b)))
        notes.append(note)
    paths = [r.fact("plan", "sglang", "controller") for r in (a, b)]
    if None not in paths and paths[0] != paths[1]:
        said = ["SGLang's controller path" if p else "SGLang's decisions path" for p in paths]
        notes.append(f"warning: A ran {said[0]}, B {said[1]}: counts beside the decisions "
                     "differ by data path, not only by the change (run both as sides of one "
                     "run, --sglang A,B, to put them on one path)")
    return a, b, notes


def _renamed(frame: pd.DataFrame | None, names: dict) -> pd.DataFrame | None:
    if frame is None or "protocol" not in frame:
        return frame
    return frame.assign(protocol=frame["protocol"].astype(str).map(lambda p: names.get(p, p)))


def _config_rows(key: tuple, groups: dict, metrics: list[TimingMetric], present: dict,
                 timing: TimingOptions) -> list[dict]:
    """Count and timing rows of one configuration, or one row saying which side has it."""
    if key not in groups[("a", "requests")] or key not in groups[("b", "requests")]:
        side = "B" if key in groups[("b", "requests")] else "A"
        return [{"kind": "configuration", "verdict": f"only in {side}"}]
    frames = {where: g.get(key) for where, g in groups.items()}  # None: no rows there
    ca, cb = (counts(frames[(s, "requests")], frames[(s, "steps")]) for s in "ab")
    n_steps = tuple(0 if frames[(s, "steps")] is None else len(frames[(s, "steps")])
                    for s in "ab")
    return count_rows(ca, cb, n_steps) + timing_rows(metrics, frames, present, timing)


def compare(a: Run, b: Run, threshold: float = DEFAULT_THRESHOLD,
            metrics: list[str] | None = None, timing: TimingOptions | None = None
            ) -> Comparison:
    """Refuse incomparable runs, match A's and B's configurations, build every row (timing
    `metrics` by name, all present when None; `threshold` as compare's --threshold;
    `timing` a served A/B's own interval, bench.compare.rows.TimingOptions)."""
    check_comparable(a, b)
    both = sglang_run(a.requests) and sglang_run(b.requests)
    paired = sglang_run(a.requests) or sglang_run(b.requests)
    notes = []
    if both:  # two SGLangs: their rows pair by side (sides_pairing), or as named
        a, b, notes = _pair_sides(a, b)
    elif paired:  # SGLang's own code against the project's model of it: by model
        a, b = (replace(r, requests=as_modelled(r.requests), steps=as_modelled(r.steps),
                        ranks=as_modelled(r.ranks))
                for r in (a, b))
    keys = match_keys(a, b)
    groups = {(s, t): _groups(_keyed(run.table(t), keys, t), keys, f"{run.path}/{t}.csv")
              for s, run in (("a", a), ("b", b)) for t in ("requests", "steps", "ranks")}
    metrics, present = reported_metrics(a, b, metrics)
    timing = timing or TimingOptions(threshold)
    comp = Comparison(a, b, keys, threshold,
                      header=verdict_warnings(a, b) + env_warnings(a, b) + plan_notes(a, b)
                      + notes, drift_note=DRIFT)
    for key in sorted(set(groups[("a", "requests")]) | set(groups[("b", "requests")]),
                      key=_order):
        cells = dict(zip(keys, key, strict=True))
        comp.rows += [cells | row for row in _config_rows(key, groups, metrics, present, timing)]
    if not any(r["kind"] != "configuration" for r in comp.rows):
        raise ResultFileError(
            "no configuration is in both runs (A: " + _configs(groups[("a", "requests")])
            + "; B: " + _configs(groups[("b", "requests")]) + "): nothing to compare")
    if paired:
        lines, md = per_request_section(a.requests, b.requests)
        comp.header += lines
        comp.sections += md
    return comp
