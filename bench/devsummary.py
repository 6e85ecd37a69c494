"""The short report of scripts/gpu_check.sh, from what it left in its work directory.

Layout of WORK_DIR (written by the script): `status/<step>` holds each step's exit code,
`<step>.log` its output, `devcheck.json` the device measurements, `tp1/` and `tp2/` the two
bench runs' result directories. Unknown values print as "n/a", never as a made-up number.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

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
    if not (run / "requests.csv").exists():
        return {}
    req = pd.read_csv(run / "requests.csv")
    steps = pd.read_csv(run / "steps.csv")
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


def _device_lines(dc: dict) -> list[str]:
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
        f"{_fmt(lb.get('scattered_gbps'), ' GB/s', 2)}{_pct(lb.get('scattered_gbps'), peak)}; bad "
        f"pages {lb.get('consecutive_bad_pages', 'n/a')}/{lb.get('scattered_bad_pages', 'n/a')}",
        f"  {model} TP1 forward:   decode b1 {_fmt(fw.get('decode_b1_ms'), ' ms', 2)}, b32 "
        f"{_fmt(fw.get('decode_b32_ms'), ' ms', 2)}; prefill 512 tok "
        f"{_fmt(fw.get('prefill_512_ms'), ' ms', 2)}, 2048 tok "
        f"{_fmt(fw.get('prefill_2048_ms'), ' ms', 2)}",
    ]


def _run_line(work: Path, step: str, peak) -> str:
    f = _run_facts(work / step)
    env_path = work / step / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    device = (env.get("world") or {}).get("device", "?")
    head = (f"  {STEPS[step]} [{env.get('model', '?')}, {device}/"
            f"{env.get('data_backend', '?')}]: {_status(work, step)}")
    if not f:
        return head
    return (f"{head}; decode forward p50 {_fmt(f['decode_forward_ms'], ' ms', 2)}; "
            f"prefill p50 {_fmt(f['prefill_ms'], ' ms', 2)}; load-back p50 "
            f"{_fmt(f['load_back_gbps'], ' GB/s', 2)}{_pct(f['load_back_gbps'], peak)} per "
            f"load-back of {_size(f['load_back_bytes'])} (median)")


def summary_lines(work: Path) -> tuple[list[str], bool]:
    dc_path = work / "devcheck.json"
    dc = json.loads(dc_path.read_text()) if dc_path.exists() else {}
    where = dc.get("gpu") or ("CPU dry run" if dc.get("device") == "cpu" else "unknown device")
    lines = [f"gpu_check summary: {where}"]
    lines.append(f"  {STEPS['setup']}: {_status(work, 'setup')}")
    lines.append(f"  {STEPS['tests']}: {_status(work, 'tests')} "
                 f"({_last_line(work / 'tests.log').strip('= ')})")
    lines.append(f"  {STEPS['devcheck']}: {_status(work, 'devcheck')}")
    if dc:
        lines += _device_lines(dc)
    lines += [_run_line(work, s, dc.get("h2d_peak_gbps")) for s in ("tp1", "tp2")]
    ok = all(_status(work, s) == "OK" for s in STEPS)
    bad = dc.get("load_back", {})
    ok = ok and bad.get("consecutive_bad_pages") == 0 and bad.get("scattered_bad_pages") == 0
    lines.append(f"RESULT: {'OK' if ok else 'FAILED'}")
    return lines, ok
