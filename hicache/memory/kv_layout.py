"""How big a KV page is, and how many pages the host and device pools hold, for one rank.

Two kinds of page:
- synthetic (CPU runs, and the toy model): a page is its float32 signature row of
  `kv_page_elems` values, and the pools hold the configured page counts;
- real (CUDA with a model shape, or `kv_bytes="real"`): a page weighs the model's KV bytes of
  `page_size` tokens on this TP rank (`ModelShape.kv_bytes_per_page`: llama3-8b at TP1 is
  8 MiB), the signature row plus bulk bytes. Page counts are then bounded by
  `kv_budget_gib` per pool per rank (host pinned memory and device memory each), so a
  llama3-8b run does not try to pin 8192 x 8 MiB = 64 GiB: 4 GiB holds 512 pages (32768
  tokens), enough for the benchmark's in-flight prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.spec.config import HiCacheConfig
from hicache.spec.shapes import get_shape

SIGNATURE_BYTES_PER_ELEM = 4  # float32 (pools.page_content)


@dataclass(frozen=True)
class KVLayout:
    real: bool
    page_bytes: int  # one page on this rank: signature plus bulk
    bulk_bytes: int
    host_pages: int
    device_pages: int


def real_kv_bytes(cfg: HiCacheConfig, device: torch.device) -> bool:
    if cfg.kv_bytes != "auto":
        return cfg.kv_bytes == "real"
    return device.type == "cuda" and cfg.model != "toy"


def kv_layout(cfg: HiCacheConfig, device: torch.device) -> KVLayout:
    """Page size and pool page counts for this configuration on `device`."""
    signature = cfg.kv_page_elems * SIGNATURE_BYTES_PER_ELEM
    real = real_kv_bytes(cfg, device)
    if not real and (cfg.unbounded_pools or not cfg.tiers):
        return KVLayout(False, signature, 0, cfg.host_pool_pages, cfg.device_pool_pages)
    if not real:
        # The device tier on synthetic pages: each pool holds what kv_budget_gib holds of
        # the model's pages (the modelled bytes; the content stays a small signature).
        host, dev = _budget_pages(cfg, get_shape(cfg.model).kv_bytes_per_page(cfg.page_size,
                                                                               cfg.tp))
        return KVLayout(False, signature, 0, host, dev)
    if cfg.unbounded_pools:
        raise ValueError("unbounded pools need synthetic KV pages (real ones are bounded by "
                         "memory): kv_bytes synthetic")
    page = get_shape(cfg.model).kv_bytes_per_page(cfg.page_size, cfg.tp)
    page = max(page, signature)
    host, dev = _budget_pages(cfg, page)
    return KVLayout(True, page, page - signature, host, dev)


def _budget_pages(cfg: HiCacheConfig, page: int) -> tuple[int, int]:
    """(host, device) pages: what kv_budget_gib holds of `page`-byte pages on the device
    (host_ratio times that on the host with the device tier), at most the configured page
    counts."""
    budget = int(cfg.kv_budget_gib * 2**30)
    host_budget = int(budget * (cfg.host_ratio if cfg.tiers else 1.0))
    host, dev = min(cfg.host_pool_pages, host_budget // page), min(cfg.device_pool_pages,
                                                                  budget // page)
    if min(host, dev) < 1:
        raise ValueError(f"kv_budget_gib {cfg.kv_budget_gib} holds no {cfg.model} page of "
                         f"{page / 2**20:.1f} MiB (page_size {cfg.page_size}, TP {cfg.tp})")
    return host, dev


def max_input_tokens(device_pages: int, page: int) -> int:
    """SGLang 0.5.23's max_req_input_len (tp_worker.py): min(context_len - 1, kv_capacity -
    1) - 5, with the device pool's tokens as the capacity (the model here has no context
    length of its own). A prompt of this length or more is refused (validate_input_length)."""
    return device_pages * page - 1 - 5


def budget_holding(cfg: HiCacheConfig, device: torch.device, tokens: int) -> float | None:
    """The kv_budget_gib whose device pool admits a prompt of `tokens`; None where the
    budget does not size the pool (synthetic pages without the device tier, unbounded
    pools) or device_pool_pages caps it below that."""
    pages = -(-(tokens + 7) // cfg.page_size)  # tokens < pages * page - 6
    real = real_kv_bytes(cfg, device)
    if pages > cfg.device_pool_pages or cfg.unbounded_pools or not (real or cfg.tiers):
        return None
    page = get_shape(cfg.model).kv_bytes_per_page(cfg.page_size, cfg.tp)
    if real:
        page = max(page, cfg.kv_page_elems * SIGNATURE_BYTES_PER_ELEM)
    return pages * page / 2**30
