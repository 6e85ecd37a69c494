"""Requests refused for their length (terminated_by `rejected`, hicache.serve.scheduler) in the
offline half: counted per cell, absent from the figures of the served ones, a note in an OK
verdict; and the line before the first cell that says how many will be refused."""

import math

import pandas as pd
import torch

from bench.analysis.summarize import summarize
from bench.run import fit
from bench.run.plan import RunPlan
from bench.rundir.schema import REQUEST_COLUMNS
from bench.verdict.run_rules import judge
from hicache.memory.kv_layout import budget_holding, kv_layout, max_input_tokens
from hicache.spec.config import HiCacheConfig
from tests.test_summarize import req, steps_frame


def _frame() -> pd.DataFrame:
    rows = [req(("pr27010", "wait_complete", 0, "a"), 100, 1, 1, 640, 1, prompt_tokens=700,
                computed_tokens=60, storage_hit_tokens=640),
            req(("pr27010", "wait_complete", 0, "b"), 50, 0, 0, 0, 0, prompt_tokens=300,
                computed_tokens=300),
            # Refused: no first token, no collectives, its length in prompt_tokens.
            req(("pr27010", "wait_complete", 0, "c"), None, 0, 0, 0, 0, prompt_tokens=90_000,
                terminated_by="rejected", hit_query_collectives=0)]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def test_summary_counts_the_rejected_and_leaves_them_out_of_the_figures():
    r = summarize(_frame(), steps_frame()).iloc[0]
    assert (r.requests, r.rejected_requests) == (3, 1)
    assert r.ttft_p50_ms == 75.0  # the two served ones
    assert r.polls_per_req == 0.5 and r.background_collectives_per_req == 1.0
    assert math.isclose(r.storage_hit_ratio, 640 / 1000)  # 90,000 refused tokens not in it
    assert r.ranks_agree


def test_the_verdict_stays_ok_and_says_how_many_were_rejected():
    v = judge(_frame())
    assert v.ok and v.line == "OK"
    assert len(v.notes) == 1
    assert v.notes[0].startswith("1 request(s) rejected")
    assert "pr27010/wait_complete repeat 0: 1" in v.notes[0] and "90000" in v.notes[0]


def test_the_limit_and_the_budget_that_lifts_it():
    assert max_input_tokens(1024, 64) == 65530  # SGLang: 65536 - 1 - 5
    cfg = HiCacheConfig(write_policy="write_through", model="llama3-8b", device_pool_pages=4096)
    cpu = torch.device("cpu")
    for tokens in (10_000, 70_000, 94_991):
        gib = budget_holding(cfg, cpu, tokens)
        bigger = kv_layout(HiCacheConfig(**{**cfg.__dict__, "kv_budget_gib": gib}), cpu)
        assert max_input_tokens(bigger.device_pages, 64) > tokens  # holds it
        smaller = kv_layout(HiCacheConfig(**{**cfg.__dict__, "kv_budget_gib": gib * 0.999}),
                            cpu)
        assert max_input_tokens(smaller.device_pages, 64) <= tokens  # and no less does
    # Without the device tier the budget does not size synthetic pools: no budget to name.
    assert budget_holding(HiCacheConfig(), cpu, 70_000) is None


def test_the_line_before_the_first_cell_counts_the_planned_requests_past_the_pool():
    from bench.run.trace import TraceSpec

    excerpt = "traces/mooncake_conversation_400.jsonl"
    spec = TraceSpec(excerpt, 0, 40)
    longest = max(r.input_length for r in spec.rows()[:40])
    page = 64
    pool = (longest // 2) // page  # half the longest prompt's pages
    plan = RunPlan(preset="t", protocols=["pr36425"], policies=["wait_complete"],
                   rates=[1.0], repeats=1, tp=2, pp=1, trace=spec,
                   system=(("write_policy", "write_through"), ("kv_bytes", "synthetic"),
                           ("unbounded_pools", True), ("device_pool_pages", pool)))
    over = sum(r.input_length >= max_input_tokens(pool, page) for r in spec.rows()[:40])
    line = fit.oversized_line(plan, torch.device("cpu"))
    assert line.startswith(f"{over} of 40 planned requests per cell exceed")
    assert f"the longest is {longest}" in line and "will be rejected" in line
    assert f"{-(-(longest + 7) // page)} pages would hold them all" in line
