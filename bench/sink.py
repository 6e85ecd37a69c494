"""Rank 0's result sink: turns each cell's gathered per-rank stats into rows, checks that
ranks agreed and data matched storage, and rewrites the CSVs atomically after every cell
(a failure later in the run keeps every finished cell on disk).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

from bench.envinfo import collect_env
from bench.io import write_csv_atomic, write_json_atomic
from bench.plan import Cell, RunPlan
from bench.schema import RANK_COLUMNS, REQUEST_COLUMNS, SCHEMA_VERSION, STEP_COLUMNS
from hicache.comm import SITES
from hicache.consensus import compare_decisions, describe_disagreements

MS = 1000.0


class ResultSink:
    def __init__(self, plan: RunPlan):
        self.plan, self.dir = plan, Path(plan.out_dir)
        self.requests: list[dict] = []
        self.steps: list[dict] = []
        self.ranks: list[dict] = []
        self.problems: list[str] = []
        world = {"world_size": plan.world_size, "tp": plan.tp, "pp": plan.pp,
                 "device": plan.device, "backend": plan.backend}
        debug = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF")
        write_json_atomic(self.dir / "env.json", {**collect_env(plan.backend, world),
                                                  "schema_version": SCHEMA_VERSION,
                                                  "torch_distributed_debug": debug,
                                                  "plan": _plan_dict(plan)})

    def begin(self, cell: Cell, total: int) -> None:
        write_json_atomic(self.dir / "progress.json", {**cell.__dict__, "total": total})
        print(f"[{cell.index + 1:3d}/{total}] {cell.protocol:<12} {cell.policy:<13} "
              f"rate={cell.rate_rps:g} repeat={cell.repeat} ...", end="", file=sys.stderr,
              flush=True)

    def add(self, cell: Cell, gathered: list[dict]) -> None:
        config = self._config(cell)
        rows = self._request_rows(cell, config, gathered)
        self.requests += rows
        self.steps += [self._step_row(config, cell, s) for s in gathered[0]["steps"]]
        self.ranks += [self._rank_row(config, cell, p) for p in gathered]
        self._write()
        ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
        agree = all(r["ranks_agree"] for r in rows)
        print(f" ttft p50 {statistics.median(ttft) if ttft else float('nan'):7.1f} ms, "
              f"polls/req {statistics.fmean(r['polls'] for r in rows):5.2f}, "
              f"decision/req {statistics.fmean(r['decision_collectives'] for r in rows):5.2f}"
              f"{'' if agree else '  RANKS DISAGREE'}", file=sys.stderr, flush=True)

    def _config(self, cell: Cell) -> dict:
        p = self.plan
        cfg = p.config(cell)
        return {"preset": p.preset, "protocol": cell.protocol, "policy": cell.policy,
                "tp": p.tp, "pp": p.pp, "world_size": p.world_size, "device": p.device,
                "backend": p.backend, "storage": p.storage.kind, "rate_rps": cell.rate_rps,
                "seed": p.seed, "page_size": cfg.page_size, "extra_pool": cfg.extra_pool,
                "race_guard": cfg.race_guard}

    def _request_rows(self, cell: Cell, config: dict, gathered: list[dict]) -> list[dict]:
        logs = [p["decisions"] for p in gathered]
        agree, _ = compare_decisions(logs)
        per_rank = [{r["rid"]: r for r in p["requests"]} for p in gathered]
        rows = []
        t0 = min((r["arrival"] for r in gathered[0]["requests"]), default=0.0)
        for r in gathered[0]["requests"]:
            rid = r["rid"]
            everywhere = [pr.get(rid) for pr in per_rank]
            finished = all(x is not None and x["first_token"] is not None for x in everywhere)
            errors = sum(x["data_errors"] for x in everywhere if x is not None)
            rows.append({**config, "repeat": cell.repeat, **_timing(r, t0),
                         **_counts(r), "ranks_agree": agree.get(rid, True) and finished,
                         "data_ok": errors == 0})
        for line in describe_disagreements(logs, self.plan.tp)[:3]:
            self.problems.append(f"{cell.protocol}/{cell.policy} repeat {cell.repeat}: {line}")
        return rows

    def _step_row(self, config: dict, cell: Cell, s: dict) -> dict:
        row = {**config, "repeat": cell.repeat, "step": s["step"], "t_s": s["t"],
               "waiting": s["waiting"], "polled": s["polled"], "scheduled": s["scheduled"],
               "sync_ms": s["sync_s"] * MS}
        for site in ("request_broadcast", "per_step_min", "model_allreduce", "decision",
                     "completion", "pp_hop"):
            row[site] = s.get(f"coll_{site}", 0)
        return row

    def _rank_row(self, config: dict, cell: Cell, p: dict) -> dict:
        ok = all(a == b for a, b in p["crosscheck"].values())
        if not ok:
            self.problems.append(f"rank {p['rank']} counter != torch sequence numbers in "
                                 f"{cell.protocol}/{cell.policy}: {p['crosscheck']}")
        return {**config, "repeat": cell.repeat, "rank": p["rank"], "tp_rank": p["tp_rank"],
                "pp_rank": p["pp_rank"], **{s: p["by_site"].get(s, 0) for s in SITES},
                "crosscheck_ok": ok}

    def _write(self) -> None:
        write_csv_atomic(self.dir / "requests.csv", self.requests, REQUEST_COLUMNS)
        write_csv_atomic(self.dir / "steps.csv", self.steps, STEP_COLUMNS)
        write_csv_atomic(self.dir / "ranks.csv", self.ranks, RANK_COLUMNS)

    def finish(self) -> dict:
        """Report, table and the closing verdict."""
        import pandas as pd

        from bench.report import write_report  # matplotlib: imported once, at the end
        from bench.summarize import format_table, summarize

        (self.dir / "progress.json").unlink(missing_ok=True)
        write_report(self.dir)
        summary = summarize(pd.DataFrame(self.requests), pd.DataFrame(self.steps))
        print(format_table(summary))
        why = self._verdict()
        line = "OK" if not why else f"FAILED: {why}"
        return {"ok": not why, "line": line, "dir": str(self.dir)}

    def _verdict(self) -> str:
        bad_agree = sum(not r["ranks_agree"] for r in self.requests)
        bad_data = sum(not r["data_ok"] for r in self.requests)
        reasons = []
        if bad_agree:
            reasons.append(f"ranks disagreed on {bad_agree} request(s) ({self.problems[0]})"
                           if self.problems else f"ranks disagreed on {bad_agree} request(s)")
        if bad_data:
            reasons.append(f"{bad_data} request(s) loaded data that differs from storage")
        reasons += [p for p in self.problems if "sequence numbers" in p][:1]
        return "; ".join(reasons)


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
    return {"rid": r["rid"], "arrival_s": arrival - t0, "ttft_ms": ttft, "queue_ms": queue,
            "prefetch_io_ms": io, "sched_lag_ms": lag, "sync_ms": r["sync_s"] * MS,
            "load_back_ms": load, "prefill_ms": prefill}


def _counts(r: dict) -> dict:
    return {"polls": r["polls"], "decision_collectives": r.get("coll_decision", 0),
            "completion_collectives": r.get("coll_completion", 0),
            "hit_query_collectives": r.get("coll_hit_query", 0),
            "ack_collectives": r.get("coll_ack", 0), "pp_hops": r.get("coll_pp_hop", 0),
            "terminated_by": r["terminated_by"], "op_issued": r["op_issued"],
            "io_issued": r["io_issued"], "prefetch_requested_tokens": r["requested_tokens"],
            "hit_tokens": r["hit_tokens"], "prefetched_tokens": r["prefetched_tokens"]}


def _plan_dict(plan: RunPlan) -> dict:
    d = {k: v for k, v in plan.__dict__.items() if k not in ("workload", "storage", "system")}
    d.update(workload=plan.workload.__dict__, storage=plan.storage.__dict__,
             system=dict(plan.system))
    return d
