"""The engine of `python -m bench devcheck`: the device measurements of scripts/gpu_check.sh
and its summary.

    python -m bench devcheck measure --device cuda --model llama3-8b --out devcheck.json
    python -m bench devcheck summary WORK_DIR

`measure` (one process, TP1, no process group): the host->device peak (pinned, and pageable
for contrast), one request's load-back of real KV pages through `LoadBack` (consecutive and
scattered slots) with its achieved GB/s and a checksum of every page, and the shaped
forward's decode and prefill times (median of timed forwards after warm-up; each forward
ends with a device sync, so wall clock is the step's time). On CPU the same code runs with
CPU memory and no peak. `summary` reads what gpu_check.sh left in WORK_DIR and prints the
short report; exit 0 when every step passed. Layout of WORK_DIR (written by the script):
`status/<step>` holds each step's exit code, `<step>.log` its output, `devcheck.json` the
device measurements, `tp1/` and `tp2/` the two bench runs' result directories. Unknown
values print as "n/a", never as a made-up number.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pandas as pd

from bench.report.printer import wrapped
from bench.rundir.rundir import RunDir

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
    from hicache.comm.comm import CollectiveCounter, Comm
    from hicache.comm.groups import Groups, Layout
    from hicache.model.gpu_model import GpuModel
    from hicache.spec.shapes import get_shape

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
    from hicache.memory.kv_layout import kv_layout
    from hicache.memory.loadback import LoadBack
    from hicache.memory.pools import PagePool, expected_rows, verify_pages
    from hicache.spec.config import HiCacheConfig

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

    from hicache.memory.loadback import h2d_peak

    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    out = {"device": device_kind, "model": model_name, **h2d_peak(device)}
    out["h2d_pageable_gbps"] = _pageable_gbps(device, out["h2d_bytes"] or 0)
    out["load_back"] = load_back_check(model_name, device)
    out["forward"] = forward_times(model_name, device)
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


# ---- the summary of gpu_check.sh's work directory ----------------------------------------

STEPS = {"setup": "offline setup (PIP_NO_INDEX=1)", "tests": "CUDA tests",
         "devcheck": "device check (H2D, load-back, forward)",
         "tp1": "TP1 run", "tp2": "TP2 shared-GPU run (gloo data plane)"}


def _status(work: Path, step: str) -> str:
    path = work / "status" / step
    if not path.exists():
        return "NOT RUN"
    return "OK" if path.read_text().strip() == "0" else f"FAILED (exit {path.read_text().strip()})"


def _fmt(value, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _pct(value, peak) -> str:
    return f" ({100 * value / peak:.0f}% of peak)" if value and peak else ""


def _last_line(path: Path) -> str:
    lines = path.read_text().strip().splitlines() if path.exists() else []
    return lines[-1].strip() if lines else ""


def _run_facts(run: Path) -> dict:
    """Decode-step and prefill medians and load-back GB/s of one bench run's CSVs."""
    if not RunDir(run).has("requests"):
        return {}
    req, steps = RunDir(run).requests(), RunDir(run).steps()
    decode = steps.loc[steps["kind"] == "decode", "forward_ms"].dropna()
    gbps = req["load_back_gbps"].dropna() if "load_back_gbps" in req else pd.Series([])
    loaded = req["load_back_bytes"] if "load_back_bytes" in req else pd.Series([])
    return {"decode_forward_ms": decode.median() if len(decode) else None,
            "prefill_ms": req["prefill_ms"].median() if len(req) else None,
            "load_back_gbps": gbps.median() if len(gbps) else None,
            "load_back_bytes": loaded.median() if len(loaded) else None}


def _size(nbytes) -> str:
    if nbytes is None:
        return "n/a"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def device_lines(dc: dict) -> list[str]:
    """`measure`'s figures for people (devcheck.json holds them all), indented two spaces."""
    peak, lb, fw = dc.get("h2d_peak_gbps"), dc.get("load_back", {}), dc.get("forward", {})
    model = dc.get("model", "?")
    h2d = (f"{_fmt(peak, ' GB/s')} pinned ({(dc.get('h2d_bytes') or 0) >> 20} MiB); pageable "
           f"{_fmt(dc.get('h2d_pageable_gbps'), ' GB/s')}" if peak
           else f"none ({dc.get('h2d_reason')})")
    return [
        f"  H2D peak:                 {h2d}",
        f"  load-back {lb.get('pages')} x {_size(lb.get('page_bytes'))} pages: "
        f"consecutive {_fmt(lb.get('consecutive_gbps'), ' GB/s', 2)}"
        f"{_pct(lb.get('consecutive_gbps'), peak)}, scattered "
        f"{_fmt(lb.get('scattered_gbps'), ' GB/s', 2)}{_pct(lb.get('scattered_gbps'), peak)}",
        f"    bad pages {lb.get('consecutive_bad_pages', 'n/a')}/"
        f"{lb.get('scattered_bad_pages', 'n/a')} (consecutive/scattered, by checksum)",
        f"  {model} TP1 forward:   decode b1 {_fmt(fw.get('decode_b1_ms'), ' ms', 2)}, b32 "
        f"{_fmt(fw.get('decode_b32_ms'), ' ms', 2)}; prefill 512 tok "
        f"{_fmt(fw.get('prefill_512_ms'), ' ms', 2)}, 2048 tok "
        f"{_fmt(fw.get('prefill_2048_ms'), ' ms', 2)}",
    ]


def _run_lines(work: Path, step: str, peak) -> list[str]:
    f = _run_facts(work / step)
    env_path = RunDir(work / step).file("env")
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    device = (env.get("world") or {}).get("device", "?")
    head = (f"  {STEPS[step]} [{env.get('model', '?')}, {device}/"
            f"{env.get('data_backend', '?')}]: {_status(work, step)}")
    if not f:
        return [head]
    return [head, f"    decode forward p50 {_fmt(f['decode_forward_ms'], ' ms', 2)}; prefill p50 "
                  f"{_fmt(f['prefill_ms'], ' ms', 2)}",
            f"    load-back p50 {_fmt(f['load_back_gbps'], ' GB/s', 2)}"
            f"{_pct(f['load_back_gbps'], peak)} per load-back of "
            f"{_size(f['load_back_bytes'])} (median)"]


NO_CUDA = "needs CUDA"  # the skip reason of every CUDA test gpu_check.sh runs


def _cuda_skips(log: Path) -> int:
    """How many tests pytest's -rs lines in `log` skipped for want of CUDA
    ("SKIPPED [2] tests/test_loadback.py:111: needs CUDA")."""
    n = 0
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith("SKIPPED [") and line.rstrip().endswith(NO_CUDA):
            n += int(line[len("SKIPPED ["):line.index("]")])
    return n


def _tests_status(work: Path) -> str:
    """The tests step's status; SKIPPED, not OK, when it passed with its CUDA tests skipped
    (torch saw no GPU): a GPU check that ran no GPU test has not passed. The condition is
    one (torch.cuda.is_available()), so one skipped means all of them were."""
    status, skipped = _status(work, "tests"), _cuda_skips(work / "tests.log")
    if status == "OK" and skipped:
        return f"SKIPPED (no CUDA test ran: {skipped} skipped, {NO_CUDA})"
    return status


def summary_lines(work: Path) -> tuple[list[str], bool]:
    dc_path = work / "devcheck.json"
    dc = json.loads(dc_path.read_text()) if dc_path.exists() else {}
    where = dc.get("gpu") or ("CPU dry run" if dc.get("device") == "cpu" else "unknown device")
    lines = [f"gpu_check summary: {where}"]
    lines.append(f"  {STEPS['setup']}: {_status(work, 'setup')}")
    tests = _tests_status(work)
    lines.append(f"  {STEPS['tests']}: {tests} ({_last_line(work / 'tests.log').strip('= ')})")
    lines.append(f"  {STEPS['devcheck']}: {_status(work, 'devcheck')}")
    if dc:
        lines += device_lines(dc)
    lines += [x for s in ("tp1", "tp2") for x in _run_lines(work, s, dc.get("h2d_peak_gbps"))]
    # A CPU dry run skips the CUDA tests by design; a GPU run that skipped them failed.
    dry = dc.get("device") == "cpu"
    ok = all(_status(work, s) == "OK" for s in STEPS if s != "tests") and (
        tests == "OK" or (dry and tests.startswith("SKIPPED")))
    bad = dc.get("load_back", {})
    ok = ok and bad.get("consecutive_bad_pages") == 0 and bad.get("scattered_bad_pages") == 0
    lines.append(f"RESULT: {'OK' if ok else 'FAILED'}")
    return wrapped(lines), ok  # a long path, reason or log line wraps at a terminal's width
