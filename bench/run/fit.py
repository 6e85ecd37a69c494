"""Before the first cell: how many of the planned requests the device KV pool can never
hold (SGLang's validate_input_length refuses them, or --allow-auto-truncate cuts them), and
the budget that would hold them all. Rank 0 says it once, from the plan alone."""

from __future__ import annotations

import torch

from bench.run.plan import RunPlan
from hicache.memory.kv_layout import budget_holding, kv_layout, max_input_tokens


def oversized_line(plan: RunPlan, device: torch.device) -> str | None:
    """One line for the console, or None when every planned prompt fits."""
    cell = plan.cells()[0]  # the pools and the prompts are the same in every cell
    cfg = plan.config(cell)
    pages = kv_layout(cfg, device).device_pages
    limit = max_input_tokens(pages, cfg.page_size)
    lengths = [len(r.tokens) for r in plan.build_workload(cell).requests]
    over = [n for n in lengths if n >= limit]
    if not over:
        return None
    fate = f"cut to {limit} tokens" if cfg.allow_auto_truncate else "rejected"
    longest = max(over)
    return (f"{len(over)} of {len(lengths)} planned requests per cell exceed the device KV "
            f"pool ({pages} pages of {cfg.page_size} tokens: prompts under {limit} tokens "
            f"fit; the longest is {longest}): they will be {fate}; "
            f"{_remedy(cfg, device, longest)}")


def _remedy(cfg, device: torch.device, longest: int) -> str:
    gib = budget_holding(cfg, device, longest)
    if gib is not None:
        return f"--kv-budget-gib {_up(gib)} would hold them all"
    pages = -(-(longest + 7) // cfg.page_size)
    return (f"a device pool of {pages} pages would hold them all (device_pool_pages sizes it "
            f"here, not --kv-budget-gib)")


def _up(gib: float) -> str:
    """Rounded up to two decimals, so the budget named holds the longest prompt."""
    return f"{-(-round(gib * 1e6) // 10_000) / 100:.2f}"
