"""`python -m bench devcheck`: the device measurements of scripts/gpu_check.sh, and its summary.

    python -m bench devcheck measure --device cuda --model llama3-8b --out devcheck.json
    python -m bench devcheck summary WORK_DIR

`measure` (one process, TP1, no process group): the host->device peak (pinned, and pageable
for contrast), one request's load-back of real KV pages through `LoadBack` (consecutive and
scattered slots) with its achieved GB/s and a checksum of every page, and the shaped
forward's decode and prefill times (median of timed forwards after warm-up; each forward
ends with a device sync, so wall clock is the step's time). On CPU the same code runs with
CPU memory and no peak. `summary` reads what gpu_check.sh left in WORK_DIR and prints the
short report; exit 0 when every step passed.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from bench.commands.common import CliParser, UsageError

DECODE_BATCHES = (1, 32)
PREFILL_TOKENS = (512, 2048)
LOAD_BACK_PAGES = 20  # one benchmark request's prefix: 1280 tokens of 64-token pages


def _forward_ms(model, new_tokens: int, decode_reqs: int, reps: int = 5) -> float:
    for _ in range(2):  # warm-up: kernels picked, allocator and caches warm
        model.forward(new_tokens, decode_reqs)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward(new_tokens, decode_reqs)  # ends with a device sync
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def forward_times(model_name: str, device) -> dict:
    from hicache.comm import CollectiveCounter, Comm, Groups, Layout
    from hicache.gpu_model import GpuModel
    from hicache.shapes import get_shape

    layout = Layout(0, 1, 1)
    comm = Comm(layout, Groups(layout, "gloo", 60.0), CollectiveCounter())
    model = GpuModel(get_shape(model_name), 1, device, comm)
    out = {f"decode_b{b}_ms": _forward_ms(model, 0, b) for b in DECODE_BATCHES}
    out.update({f"prefill_{t}_ms": _forward_ms(model, t, 0) for t in PREFILL_TOKENS})
    return out


def _pageable_gbps(device, nbytes: int) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    host = torch.empty(nbytes, dtype=torch.uint8)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host)
    torch.cuda.synchronize(device)  # timed region starts with the device idle
    t0 = time.perf_counter()
    dev.copy_(host)
    torch.cuda.synchronize(device)  # and ends when the copy landed
    return round(nbytes / (time.perf_counter() - t0) / 1e9, 2)


def load_back_check(model_name: str, device) -> dict:
    """One request's prefix of real pages copied host->device, consecutive then scattered."""
    from hicache.config import HiCacheConfig
    from hicache.kv_layout import kv_layout
    from hicache.loadback import LoadBack
    from hicache.pools import PagePool, expected_rows, verify_pages

    n = LOAD_BACK_PAGES
    kv = kv_layout(HiCacheConfig(model=model_name, kv_bytes="real", host_pool_pages=2 * n,
                                 device_pool_pages=2 * n), device)
    host = PagePool("kv", 2 * n, 128, "cpu", device.type == "cuda", bulk_bytes=kv.bulk_bytes)
    dev = PagePool("kv", 2 * n, 128, device, bulk_bytes=kv.bulk_bytes)
    hashes = [f"{i:064x}" for i in range(1, n + 1)]
    src = list(range(n))
    host.write(src, expected_rows(hashes, 0, "kv", 128))
    loader, out = LoadBack(device), {"page_bytes": kv.page_bytes, "pages": n}
    scattered = list(range(2 * n - 1, 0, -2))  # every other slot, descending: no runs
    for name, dst in (("consecutive", list(range(n))), ("scattered", scattered)):
        loader.copy([(host, dev)], src, dst)  # warm-up
        seconds, nbytes = loader.copy([(host, dev)], src, dst)
        out[f"{name}_gbps"] = round(nbytes / seconds / 1e9, 3)
        out[f"{name}_bad_pages"] = verify_pages(dev, dst, hashes, rank=0)
    return out


def measure(device_kind: str, model_name: str) -> dict:
    import torch

    from hicache.loadback import h2d_peak

    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    out = {"device": device_kind, "model": model_name, **h2d_peak(device)}
    out["h2d_pageable_gbps"] = _pageable_gbps(device, out["h2d_bytes"] or 0)
    out["load_back"] = load_back_check(model_name, device)
    out["forward"] = forward_times(model_name, device)
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def main_devcheck(argv: list[str]) -> int:
    p = CliParser(prog="python -m bench devcheck", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    m.add_argument("--model", default="llama3-8b")
    m.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("summary")
    s.add_argument("work_dir", type=Path)
    try:
        args = p.parse_args(argv)
    except UsageError as e:
        print(f"bench devcheck: {e}", file=sys.stderr)
        return 2
    if args.cmd == "measure":
        result = measure(args.device, args.model)
        args.out.write_text(json.dumps(result, indent=2))
        print(json.dumps(result))
        return 0
    from bench.devsummary import summary_lines

    lines, ok = summary_lines(args.work_dir)
    print("\n".join(lines))
    return 0 if ok else 1
