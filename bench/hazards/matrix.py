"""The hazard matrix: every protocol x scenario cell, each a fresh set of ranks.

Each cell's ranks are forked from one server process that imported torch and the system
once (a cell starts in well under a second), serve the scenario's burst with a short
collective timeout, and write their reports into the cell's directory. The launcher kills
a cell that outlives its bound, never a silent wait; what its ranks' journals held then
makes it a livelock, a deadlock or the harness's failure (bench.hazards.hang).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch.multiprocessing as mp

from bench.hazards.cell import (
    SERVING,
    journal_paths,
    read_journal,
    run_cell,
    serve_bound_s,
)
from bench.hazards.classify import ABORT, DEADLOCK, OK, REFUSED, classify, gloo_abort
from bench.hazards.hang import Killed, classify_hang
from bench.hazards.scenarios import Scenario, runs
from bench.report.printer import fit
from bench.run.launch import launch_to_end
from hicache.comm.comm import BOOTSTRAP_RING
from sglang_adapter import (
    Target,
    consensus_verdict,
    controller_unfit,
    ships_checker,
    unservable,
)

_PRELOADED = False
# A cell's start-up (fork, rendezvous, building the system; with SGLang its import on every
# rank, about 3 s on a quiet machine): bounded apart from its serve, and generously, since
# a loaded machine (make test's workers importing SGLang beside it) slows it many times over.
START_S = 240.0


@dataclass(frozen=True)
class MatrixSpec:
    protocols: tuple[str, ...]
    scenarios: tuple[Scenario, ...]
    seed: int = 0
    timeout_s: float = 2.0  # each system collective's timeout
    out: Path = Path("results/hazards")
    # --cache sglang: SGLang's own decisions behind the seam (sglang_adapter.decisions.cache); the
    # cells run its release's model protocol as the data path's, named `Target.name`
    sglang: Target | None = None
    # --sglang-consensus: every cell served a second time with SGLang's own checker on;
    # its verdict is the sglang_consensus column (the outcome is the first serve's)
    consensus: bool = False

    def bound_s(self, s: Scenario) -> float:
        """A cell's serve's bound (START_S bounds its start-up)."""
        return serve_bound_s(self.timeout_s)

    def label(self, protocol: str) -> str:
        """The protocol column of a cell: the protocol, or SGLang's release and class."""
        return protocol if self.sglang is None else self.sglang.name


def _preload() -> None:
    global _PRELOADED
    if not _PRELOADED:
        mp.get_context("forkserver").set_forkserver_preload(["bench.hazards.cell"])
        _PRELOADED = True


def run_matrix(spec: MatrixSpec, log=print) -> list[dict]:
    """One row per cell, in scenario-major order."""
    _preload()
    rows = []
    for s in spec.scenarios:
        for protocol in spec.protocols:
            if runs(s, protocol, spec.sglang is not None):
                rows.append(refused_row(spec, s, protocol) or run_one(spec, s, protocol))
                log(_line(rows[-1]))
    return rows


def run_sides(specs: list[MatrixSpec], log=print) -> list[dict]:
    """Several SGLangs' matrices (one spec a side, the reference first), one row per cell
    per side: each scenario on every side in turn, so the sides' cells of a scenario run
    moments apart. Each cell's ranks fork from the server (which imports no SGLang) and
    import their own side's; this process imports none, checked before every cell."""
    _preload()
    rows = []
    for s in specs[0].scenarios:
        for spec in specs:
            for protocol in (p for p in spec.protocols if runs(s, p, spec.sglang is not None)):
                _no_sglang_here()
                rows.append(refused_row(spec, s, protocol) or run_one(spec, s, protocol))
                log(_line(rows[-1]))
    return rows


def _no_sglang_here() -> None:
    """Two SGLangs never meet in one interpreter: the launching process checked each side's
    and took it out again (sglang_adapter.loader.unload); a cell forks from the server."""
    if "sglang" in sys.modules:
        raise RuntimeError(f"an sglang is imported in the launching process (from "
                           f"{getattr(sys.modules['sglang'], '__file__', '?')}): a side's "
                           "cells would not be its own")


def refusal(target: Target | None, s: Scenario) -> str | None:
    """Why this side cannot run scenario `s`, in one line, said before anything serves (None:
    it can): neither of its SGLang's paths serves the cell's layout and settings
    (sglang_adapter.unservable; a source tree's release is not known here: its ranks say)."""
    why = None if target is None else unservable(target, s.pp, s.system)
    return None if why is None else f"sglang {target.label}: {why}"


def refused_row(spec: MatrixSpec, s: Scenario, protocol: str) -> dict | None:
    """A REFUSED row for a cell its side cannot run (refusal), nothing served; else None."""
    why = refusal(spec.sglang, s)
    if why is None:
        return None
    return {"scenario": s.name, "issue": s.issue, "protocol": spec.label(protocol),
            "policy": s.policy, "tp": 2, "pp": s.pp, "seed": spec.seed, "outcome": REFUSED,
            "site": None, "step": None, "detail": why, "exit_codes": "", "wall_s": 0.0,
            "collective_timeout_s": spec.timeout_s, "cell_dir": "", "named_s": None}


def run_one(spec: MatrixSpec, s: Scenario, protocol: str, tag: str = "") -> dict:
    _preload()  # a cell's ranks fork from a server that imported torch once (4 ranks: long)
    cell_dir = spec.out / "cells" / f"{s.name}__{spec.label(protocol)}{tag}"
    fresh_cell(cell_dir)
    t0 = time.monotonic()
    got, dead = launch_to_end(s.world, run_cell,
                              (s, protocol, spec.seed, spec.timeout_s, str(cell_dir),
                               sglang_path(spec.sglang, s)),
                              timeout_s=spec.bound_s(s), method="forkserver",
                              started=lambda: all_serving(cell_dir, s.world), start_s=START_S)
    wall, killed_at = time.monotonic() - t0, time.time()
    reports = [read_rank_json(cell_dir / f"rank{r}.json") or report_from_journal(cell_dir, r, dead)
               for r in range(s.world)]
    killed = killed_ranks(cell_dir, reports, got, dead, killed_at)
    found = classify_hang(killed, stall_s(spec.timeout_s), spec.bound_s(s)) if killed else \
        classify(reports, unreported(got, dead, spec.bound_s(s), s.world))
    row = {"scenario": s.name, "issue": s.issue, "protocol": spec.label(protocol),
           "policy": s.policy,
           "tp": 2, "pp": s.pp, "seed": spec.seed, **found,
           "exit_codes": exit_codes_text(got, dead, s.world), "wall_s": round(wall, 2),
           "collective_timeout_s": spec.timeout_s, "cell_dir": str(cell_dir)}
    row.update(_costs(reports[0]) if row["outcome"] == OK else {})
    row["named_s"] = _named_s(reports) if row["outcome"] in (DEADLOCK, ABORT) else None
    if spec.consensus and spec.sglang is not None and not tag.endswith(CHECKED):
        row.update(judged_by_sglang(spec, s, protocol, tag))
    return row


def sglang_path(target: Target | None, s: Scenario) -> Target | None:
    """The SGLang a cell serves with: its controller path as the data path where the
    scenario asks for it and the cell fits it, else its decisions on the project's."""
    if target is None or not s.sglang_controller or \
            controller_unfit(target, s.pp, s.system) is not None:
        return target
    return replace(target, controller=True)


CHECKED = "__sglang_consensus"


def judged_by_sglang(spec: MatrixSpec, s: Scenario, protocol: str, tag: str) -> dict:
    """The cell served again with SGLang's own consensus checker on (its own groups and
    thread), and what the checker said: `fired: <function>` (where, in the detail), `silent`, or
    `absent` for a release without it. The outcome column stays the first serve's, so the
    checker never changes the outcome it is compared with."""
    present = ships_checker(spec.sglang.root)
    if not present:
        return consensus_verdict("", s.world, present=False)
    cell_dir = spec.out / "cells" / f"{s.name}__{spec.label(protocol)}{tag}{CHECKED}"
    cell_dir.mkdir(parents=True, exist_ok=True)
    checked = replace(spec, sglang=replace(spec.sglang, consensus_dir=str(cell_dir)))
    again = run_one(checked, s, protocol, tag=tag + CHECKED)
    out = consensus_verdict(cell_dir, s.world)
    out["consensus_detail"] = (f"{out['consensus_detail']} [that serve: "
                               f"{again['outcome']}]").strip()
    return out


def fresh_cell(cell_dir: Path) -> None:
    """The cell's directory, without an earlier serve's reports and start-up marks."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    for old in [*cell_dir.glob("rank*.json"), *cell_dir.glob(f"rank*{SERVING}")]:
        old.unlink()


def all_serving(cell_dir: Path, world: int) -> bool:
    """Every rank of the cell has passed its start-up (bench.hazards.cell.mark_serving)."""
    return all((cell_dir / f"rank{r}{SERVING}").exists() for r in range(world))


def read_rank_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def report_from_journal(cell_dir: Path, rank: int, dead: dict) -> dict | None:
    """A rank that died without a report (gloo aborted it): what its journals logged."""
    if rank not in dead:
        return None  # killed at the bound, or never started: the harness's failure
    logs = {k: read_journal(p) for k, p in journal_paths(cell_dir, rank).items()}
    stderr = cell_dir / f"rank{rank}.stderr"
    return {"rank": rank, "aborted": dead[rank][0], "error": None, "recent": [],
            "gloo": gloo_abort(stderr.read_text(errors="replace")) if stderr.exists() else None,
            "stuck_s": None, "records": logs["records"], "record_steps": logs["record_steps"],
            "sequence": logs["sequence"], "group_ranks": {}, "decisions": {},
            "data_errors": 0, "steps": None}


def stall_s(collective_timeout_s: float) -> float:
    """How long a killed rank's journals may have been silent and it still stepping: a rank
    blocked in a collective fails it within the timeout; twice that, and 2 s for the kill
    (bench.run.launch joins each rank for up to 0.5 s first) and a loaded machine."""
    return 2 * collective_timeout_s + 2.0


def killed_ranks(cell_dir: Path, reports: list, got: dict, dead: dict,
                 killed_at: float) -> list[Killed]:
    """The ranks still running at the cell's bound, killed without a report, each with its
    journals and how long they had been silent at the kill (bench.hazards.hang)."""
    out = []
    for r, rep in enumerate(reports):
        if rep is not None or r in got or r in dead:
            continue
        paths = journal_paths(cell_dir, r)
        logs = {k: read_journal(p) for k, p in paths.items()}
        written = [p.stat().st_mtime for p in paths.values() if p.exists()]
        out.append(Killed(r, (cell_dir / f"rank{r}{SERVING}").exists(),
                          killed_at - max(written) if written else None, logs["records"],
                          logs["record_steps"], logs["sequence"]))
    return out


def unreported(got: dict, dead: dict, bound_s: float, world: int) -> dict[int, str]:
    """What the launcher knows of each rank, should it have written no report: the error it
    raised (a start-up failure, before its serve), its exit code, or the bound it ran past."""
    out = {}
    for r in range(world):
        if r in got:
            out[r] = f"failed: {str(got[r][2])[:200]}" if got[r][1] == "error" else "ended"
        elif r in dead:
            out[r] = f"died with exit code {dead[r][0]}"
        else:
            out[r] = f"still running at the cell's bound ({bound_s:.0f} s), killed"
    return out


def exit_codes_text(got: dict, dead: dict, world: int) -> str:
    """Each rank's end: 0 (served), 1 (its serve failed, report written), k (died), - (killed
    at the bound)."""
    codes = []
    for r in range(world):
        if r in got:
            codes.append("0" if got[r][1] == "ok" else "1")
        else:
            codes.append(str(dead[r][0]) if r in dead else "-")
    return " ".join(codes)


def _costs(rep: dict) -> dict:
    """Rank 0's cost: decision collectives per poll; the scheduler's agreement collectives
    (decision, completion and per-step MINs) per step; polls per step; PD prefill's
    admission ring's sends and receives per step (None: the stage is off)."""
    polls, steps = rep["polls"], max(1, rep["steps"])
    ring = rep["by_site"].get(BOOTSTRAP_RING)
    return {"decision_per_poll": round(rep["decision_collectives"] / polls, 3) if polls else 0.0,
            "collectives_per_step": round(rep["step_collectives"] / steps, 3),
            "polls_per_step": round(polls / steps, 3), "steps": rep["steps"],
            "ring_per_step": None if ring is None else round(ring / steps, 3)}


def _named_s(reports: list[dict | None]) -> float | None:
    """How long the ranks sat in their last, failed collective before it was named (the
    longest over ranks); bounded by the collective timeout when gloo times it out."""
    stuck = [rep["stuck_s"] for rep in reports if rep and rep["error"] and rep["stuck_s"]]
    return round(max(stuck), 2) if stuck else None


def _line(row: dict) -> str:
    cost = (f"  {row['decision_per_poll']}/poll {row['collectives_per_step']}/step"
            if row["outcome"] == OK else f"  {row['detail'][:110]}")
    return fit(f"{row['scenario']:<13} {row['protocol']:<14} {row['outcome']:<10}{cost}")
