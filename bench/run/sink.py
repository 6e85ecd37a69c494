"""Rank 0's result sink: turns each cell's gathered per-rank stats into rows (whether ranks
agreed, data matched storage, the counter matched torch's, every host slot was in the tree or
free at the end) and rewrites the CSVs atomically after every cell (a failure later in the
run keeps every finished cell on disk). What the rows cannot say (how ranks disagreed, which
group's count differed) goes to divergence.csv. The verdict is bench.verdict.run_rules'.
"""

from __future__ import annotations

import os
import statistics

from bench.report.printer import WIDTH, fit, say_err
from bench.run import calibrate
from bench.run.plan import Cell, RunPlan
from bench.run.trace import reuse_bounds
from bench.rundir.env import collect_env
from bench.rundir.files import GrowingCsv, list_cell, write_csv_atomic, write_json_atomic
from bench.rundir.rundir import RunDir
from bench.rundir.schema import (
    DIVERGENCE_COLUMNS,
    RANK_COLUMNS,
    REQUEST_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    TOKEN_COLUMNS,
    WRITE_PATH_COLUMNS,
)
from bench.rundir.timeline import write_events
from bench.stats import percentile
from hicache.agreement.consensus import (
    compare_decisions,
    describe_disagreements,
    disagreement_scope,
)
from hicache.comm.comm import SITES

MS = 1000.0


class ResultSink:
    def __init__(self, plan: RunPlan, h2d: dict | None = None):
        self.plan, self.h2d = plan, h2d or {}
        self.run = RunDir(plan.out_dir)
        self.run.path.mkdir(parents=True, exist_ok=True)  # a sweep's cost: a folder below
        self.requests = GrowingCsv(self.run.file("requests"), REQUEST_COLUMNS)
        self.steps = GrowingCsv(self.run.file("steps"), STEP_COLUMNS)
        self.ranks = GrowingCsv(self.run.file("ranks"), RANK_COLUMNS)
        self.problems: list[dict] = []  # divergence.csv: what the CSVs cannot say
        self.calib: dict | None = None  # calibration.json, once measured
        self.said = 0  # characters of the progress line so far (a cell's outcome wraps)
        self.beside_samples: list[list[float]] = []  # c after each cell, rank 0's
        world = {"world_size": plan.world_size, "tp": plan.tp, "pp": plan.pp,
                 "device": plan.device, "backend": plan.backend}
        debug = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF")
        write_json_atomic(self.run.file("env"), {**collect_env(plan.backend, world),
                                                  **data_plane(plan), **(h2d or {}),
                                                  "schema_version": SCHEMA_VERSION,
                                                  "threads_per_rank": plan.threads_per_rank,
                                                  "torch_distributed_debug": debug,
                                                  "collective_delay_ms": plan.delay_ms,
                                                  "plan": _plan_dict(plan)})

    def calibration(self, per_rank: list[list[float]]) -> None:
        """calibration.json: c, the control-plane all-reduce latency (bench.run.calibrate)."""
        self.calib = calibrate.summarize(per_rank, self.plan.tp, self.plan.pp,
                                         self.plan.delay_ms)
        write_json_atomic(self.run.file("calibration"), self.calib)
        c = self.calib["allreduce"]
        added = f" (+{self.plan.delay_ms:g} ms added)" if self.plan.delay_ms else ""
        if not self.calib["n"]:  # TP1: no TP group, so no all-reduce to time
            say_err(f"calibration: none at TP{self.plan.tp} (no TP group to all-reduce on)")
            return
        say_err(f"calibration{added}: one control-plane all-reduce (TP{self.plan.tp}, gloo) "
                f"p50 {c['p50_ms']:.3f} ms, mean {c['mean_ms']:.3f} ms, p99 {c['p99_ms']:.3f} "
                f"ms (n={self.calib['n']})")

    def beside(self, samples: list[float]) -> None:
        """c timed after one more cell: calibration.json's `beside` (bench.run.calibrate)."""
        if self.calib is None:
            return
        self.beside_samples.append(samples)
        self.calib["beside"] = calibrate.beside(self.beside_samples, self.calib["allreduce"])
        write_json_atomic(self.run.file("calibration"), self.calib)

    def say(self, line: str | None) -> None:
        """A line for the person running it, before the cells (none: nothing to say)."""
        if line:
            say_err(fit(line))

    def begin(self, cell: Cell, total: int) -> None:
        write_json_atomic(self.run.file("progress"), {**cell.__dict__, "total": total})
        scale = self.plan.time_scale(cell)
        load = f"rate={cell.rate_rps:g}" if scale is None else \
            f"rate={cell.rate_rps:.2f} (x{scale:g})"
        said = (f"[{cell.index + 1:3d}/{total}] {cell.protocol:<12} {cell.policy:<13} "
                f"{load} repeat={cell.repeat} ...")
        self.said = len(said)  # the progress line so far: its outcome wraps past WIDTH
        say_err(said, end="")

    def again(self, why: str) -> None:
        """The serve just run was disturbed (bench.run.machine) and runs again."""
        said = f" disturbed ({why}), again ..."
        self.said += len(said)
        say_err(said, end="")

    def add(self, cell: Cell, gathered: list[dict], attempts: int = 1) -> None:
        """The cell's rows from its last serve (`attempts`: serves it took)."""
        config = self._config(cell)
        rows = self._request_rows(cell, config, gathered)
        steps = [self._step_row(config, cell, s) for s in gathered[0]["steps"]]
        ranks = [{**self._rank_row(config, cell, p), **_machine(p, attempts)}
                 for p in gathered]
        if self.problems:  # found while building the rows
            write_csv_atomic(self.run.file("divergence"), self.problems, DIVERGENCE_COLUMNS)
        self.requests.add(rows)
        self.steps.add(steps)
        self.ranks.add(ranks)
        for p in gathered:  # the timeline, when recorded: a file per rank, kept per cell
            if p.get("timeline") is not None:
                write_events(self.run.path, cell.__dict__,
                             {"rank": p["rank"], **p["timeline"]})
        ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
        agree = all(r["ranks_agree"] for r in rows)
        step_ms = statistics.fmean(s["step_ms"] for s in steps) if steps else float("nan")
        polled = statistics.fmean(s["polled"] for s in steps) if steps else float("nan")
        said = (f" ttft p50 {statistics.median(ttft) if ttft else float('nan'):7.1f} ms, "
                f"step {step_ms:5.1f} ms, polls/step {polled:5.1f}, "
                f"decision/req {statistics.fmean(r['decision_collectives'] for r in rows):5.2f}"
                f"{'' if agree else '  RANKS DISAGREE'}")
        wrap = self.said + len(said) > WIDTH  # a long side name: two lines
        say_err(("\n       " if wrap else "") + said)

    def _config(self, cell: Cell) -> dict:
        p = self.plan
        cfg = p.config(cell)
        return {"preset": p.preset, "protocol": cell.protocol, "policy": cell.policy,
                "tp": p.tp, "pp": p.pp, "world_size": p.world_size, "device": p.device,
                "backend": p.backend, "model": p.model, "forward": p.forward,
                "storage": p.storage.kind, "rate_rps": cell.rate_rps,
                "seed": p.seed, "page_size": cfg.page_size, "extra_pool": cfg.extra_pool,
                "race_guard": cfg.race_guard, "host_memory": cfg.host_memory,
                "workload": p.workload_name, "time_scale": p.time_scale(cell),
                "write_policy": cfg.write_policy, "schedule": cfg.schedule,
                "collective_delay_ms": cfg.collective_delay_ms}

    def _request_rows(self, cell: Cell, config: dict, gathered: list[dict]) -> list[dict]:
        logs = [p["decisions"] for p in gathered]
        agree, _ = compare_decisions(logs)
        scope = disagreement_scope(logs, self.plan.tp)
        per_rank = [{r["rid"]: r for r in p["requests"]} for p in gathered]
        rows = []
        bounds = self._reuse_bounds()
        steps = gathered[0]["steps"]  # rank 0's; its last digest is the whole schedule's
        digest = steps[-1]["schedule_digest"] if steps else ""
        t0 = min((r["arrival"] for r in gathered[0]["requests"]), default=0.0)
        for r in gathered[0]["requests"]:
            rid = r["rid"]
            everywhere = [pr.get(rid) for pr in per_rank]
            # A refused request (SGLang validate_input_length) ends without a first token.
            finished = all(x is not None and (x["first_token"] is not None
                                              or x["terminated_by"] == "rejected")
                           for x in everywhere)
            errors = sum(x["data_errors"] for x in everywhere if x is not None)
            rows.append({**config, "repeat": cell.repeat, **_timing(r, t0), **_decode(r),
                         **_counts(r), "reuse_bound_tokens": bounds.get(rid),
                         "ranks_agree": agree.get(rid, True) and finished,
                         "disagreement": scope.get(rid, "" if finished else "ranks"),
                         "data_ok": errors == 0, "schedule_digest": digest})
        for line in describe_disagreements(logs, self.plan.tp)[:3]:
            self._problem(cell, "disagreement", line)
        return rows

    def _reuse_bounds(self) -> dict[str, int]:
        """A trace's own bound on each request's reused tokens (bench.run.trace), by rid."""
        if self.plan.trace is None:
            return {}
        rows = self.plan.trace.rows()
        page = self.plan.config(self.plan.cells()[0]).page_size
        bounds = reuse_bounds(rows, page)
        return {f"t{r.line:05d}": b for r, b in zip(rows, bounds, strict=True)}

    def _step_row(self, config: dict, cell: Cell, s: dict) -> dict:
        row = {**config, "repeat": cell.repeat, "step": s["step"], "t_s": s["t"],
               "kind": s["kind"], "step_ms": (s["t_end"] - s["t"]) * MS,
               "forward_ms": s["forward_s"] * MS, "sync_ms": s["sync_s"] * MS,
               "decision_sync_ms": s["decision_sync_s"] * MS, "vt_s": s["vt"],
               "pin_wait_ms": s["pin_wait_s"] * MS, "forward_late_ms": s["forward_late_s"] * MS,
               "schedule_digest": s["schedule_digest"], "poll_ms": s["poll_s"] * MS,
               "twin_protocol": self.plan.twin(cell) or None,
               "twin_poll_ms": s["twin_poll_s"] * MS if self.plan.twin(cell) else None,
               "twin_first": s["twin_first"] if self.plan.twin(cell) else None}
        for key in ("waiting", "prefetching", "polled", "scheduled", "running",
                    "prefill_tokens", "context_tokens"):
            row[key] = s[key]
        for site in ("request_broadcast", "per_step_min", "model_allreduce", "decision",
                     "completion", "pp_hop"):
            row[site] = s.get(f"coll_{site}", 0)
        return row

    def _rank_row(self, config: dict, cell: Cell, p: dict) -> dict:
        ok = all(a == b for a, b in p["crosscheck"].values())
        if not ok:  # per group: (ops our counter saw, ops torch's sequence numbers saw)
            self._problem(cell, "crosscheck", f"rank {p['rank']}'s counter != torch's sequence "
                                              f"numbers: {p['crosscheck']}")
        leaked = p.get("host_slots_unaccounted")
        return {**config, "repeat": cell.repeat, "rank": p["rank"], "tp_rank": p["tp_rank"],
                "pp_rank": p["pp_rank"], **{s: p["by_site"].get(s, 0) for s in SITES},
                "crosscheck_ok": ok, "host_slots_unaccounted": leaked,
                **{k: p.get("write_path", {}).get(k) for k in WRITE_PATH_COLUMNS},
                "cpu_s": p["cpu_s"],
                "wall_s": p["wall_s"], "threads": p.get("threads"), **p.get("host_work", {})}

    def _problem(self, cell: Cell, kind: str, what: str) -> None:
        self.problems.append({"protocol": cell.protocol, "policy": cell.policy,
                              "repeat": cell.repeat, "kind": kind, "what": what})

    def finish(self) -> dict:
        """The ranks' part of the run is over: its rows are on disk. The command builds the
        summary, plots, verdict and report from them (bench.analysis.report.write_report)."""
        (self.run.file("progress")).unlink(missing_ok=True)
        return {"dir": str(self.run.path)}


def _machine(p: dict, attempts: int) -> dict:
    """ranks.csv's serve-level machine columns: serves the cell took, and what the machine
    lost during the one kept (bench.run.machine; unknown stays empty)."""
    m = p.get("machine") or {}
    return {"attempts": attempts, "steal_s": m.get("steal_s"),
            "other_cpu_s": m.get("other_cpu_s"), "cpu_lost": m.get("lost")}


def _timing(r: dict, t0: float) -> dict:
    """TTFT and its breakdown on rank 0's clock (ms). Unknown stays None."""
    first, arrival = r["first_token"], r["arrival"]
    ttft = None if first is None else (first - arrival) * MS
    sched, enq, io_done, ready = r["scheduled"], r["enqueued"], r["io_done"], r["ready"]
    io = lag = 0.0
    if sched is not None and r["op_issued"]:
        end = io_done if io_done is not None and io_done <= sched else ready
        if end is not None:
            io, lag = (end - enq) * MS, (sched - end) * MS
    load, prefill = r["load_back_s"] * MS, r["prefill_s"] * MS
    queue = None if ttft is None else ttft - io - lag - load - prefill
    nbytes = r.get("load_back_bytes", 0)
    gbps = nbytes / r["load_back_s"] / 1e9 if nbytes and r["load_back_s"] > 0 else None
    return {"rid": r["rid"], "arrival_s": arrival - t0, "ttft_ms": ttft, "queue_ms": queue,
            "prefetch_io_ms": io, "sched_lag_ms": lag, "sync_ms": r["sync_s"] * MS,
            "load_back_ms": load, "prefill_ms": prefill, "load_back_bytes": nbytes,
            "load_back_gbps": gbps}


def _decode(r: dict) -> dict:
    """The request's class, its end-to-end time and its inter-token latencies (ms)."""
    gaps = [g * MS for g in r["itl_s"]]
    end = None if r["finished"] is None else (r["finished"] - r["arrival"]) * MS
    out = {"request_class": r["kind"], "output_tokens": len(gaps) + (r["first_token"] is not None),
           "e2e_ms": end, "itl_ms": list_cell(gaps, ".3f")}
    for q in (50, 90, 99):
        out[f"itl_p{q}_ms"] = percentile(gaps, q)
    out["itl_mean_ms"] = statistics.fmean(gaps) if gaps else None
    return out


def _counts(r: dict) -> dict:
    return {"polls": r["polls"], "absent_polls": r["absent_polls"],
            "decision_collectives": r.get("coll_decision", 0),
            "completion_collectives": r.get("coll_completion", 0),
            "hit_query_collectives": r.get("coll_hit_query", 0),
            "ack_collectives": r.get("coll_ack", 0),
            "ticket_collectives": r.get("coll_ticket", 0), "pp_hops": r.get("coll_pp_hop", 0),
            "call_sites": r.get("call_sites", ""),
            "terminated_by": r["terminated_by"], "op_issued": r["op_issued"],
            "prefetch_ops": r["prefetch_ops"], "retries": r["retries"],
            "io_issued": r["io_issued"], "prefetch_requested_tokens": r["requested_tokens"],
            "hit_tokens": r["hit_tokens"], "prefetched_tokens": r["prefetched_tokens"],
            **{k: r[k] for k in TOKEN_COLUMNS if k in r}}


def data_plane(plan: RunPlan) -> dict:
    """env.json's data-plane facts: which backend carried the model all-reduces, and
    whether that is an NCCL measurement (gloo on CUDA: ranks shared GPUs)."""
    shared = plan.device == "cuda" and plan.backend == "gloo"
    return {"data_backend": plan.backend, "model": plan.model,
            "data_plane_note": ("gloo on CUDA: ranks share GPUs (rank r on GPU r % GPUs), "
                                "model all-reduces staged through host memory; not an NCCL "
                                "measurement") if shared else None}


def _plan_dict(plan: RunPlan) -> dict:
    d = {k: v for k, v in plan.__dict__.items()
         if k not in ("workload", "storage", "system", "trace", "sglang", "sides")}
    d.update(workload=plan.workload.__dict__, storage=plan.storage.__dict__,
             system=dict(plan.system), trace=plan.trace and plan.trace.__dict__,
             sglang=plan.sglang and _target_dict(plan.sglang),
             sides=[_target_dict(t) for t in plan.sides])
    return d


def _target_dict(target) -> dict:
    return {**target.__dict__, "name": target.name}
