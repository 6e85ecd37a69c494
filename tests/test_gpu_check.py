"""scripts/gpu_check.sh: its summary logic on fabricated GPU results, and the whole script's
--dry-run (the same steps on CPU), so the script a GPU node runs has been run before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bench.devcheck import summary_lines

REPO = Path(__file__).resolve().parent.parent
DEVCHECK = {"device": "cuda", "model": "llama3-8b", "gpu": "NVIDIA H200",
            "h2d_peak_gbps": 50.0, "h2d_bytes": 256 << 20, "h2d_pageable_gbps": 20.0,
            "load_back": {"page_bytes": 8 << 20, "pages": 20, "consecutive_gbps": 45.0,
                          "consecutive_bad_pages": 0, "scattered_gbps": 40.0,
                          "scattered_bad_pages": 0},
            "forward": {"decode_b1_ms": 7.0, "decode_b32_ms": 8.0, "prefill_512_ms": 30.0,
                        "prefill_2048_ms": 110.0}}


def _work(tmp_path: Path, statuses: dict[str, int]) -> Path:
    (tmp_path / "status").mkdir()
    for step, rc in statuses.items():
        (tmp_path / "status" / step).write_text(f"{rc}\n")
    (tmp_path / "tests.log").write_text("12 passed in 20.0s\n")
    (tmp_path / "devcheck.json").write_text(json.dumps(DEVCHECK))
    return tmp_path


def test_summary_of_a_gpu_run(tmp_path):
    work = _work(tmp_path, dict.fromkeys(("setup", "tests", "devcheck", "tp1", "tp2"), 0))
    lines, ok = summary_lines(work)
    text = "\n".join(lines)
    assert ok and lines[-1] == "RESULT: OK" and "NVIDIA H200" in lines[0]
    assert "50.0 GB/s pinned (256 MiB)" in text
    assert "consecutive 45.00 GB/s (90% of peak)" in text and "8.0 MiB pages" in text
    assert "decode b1 7.00 ms" in text and "prefill 512 tok 30.00 ms" in text


def test_summary_fails_on_a_failed_step_or_bad_pages(tmp_path):
    work = _work(tmp_path, {"setup": 0, "tests": 0, "devcheck": 0, "tp1": 0, "tp2": 1})
    lines, ok = summary_lines(work)
    assert not ok and "TP2 shared-GPU run (gloo data plane) [?, ?/?]: FAILED (exit 1)" in \
        "\n".join(lines)
    (work / "status" / "tp2").write_text("0")
    bad = {**DEVCHECK, "load_back": {**DEVCHECK["load_back"], "scattered_bad_pages": 2}}
    (work / "devcheck.json").write_text(json.dumps(bad))
    assert summary_lines(work)[1] is False


NO_GPU_LOG = """......s.........sss.....ss                                               [100%]
=========================== short test summary info ============================
SKIPPED [1] tests/test_pools.py:87: needs CUDA
SKIPPED [2] tests/test_loadback.py:111: needs CUDA
SKIPPED [1] tests/test_gpu_model.py:100: needs CUDA
20 passed, 4 skipped in 4.68s
"""


def test_tests_that_skipped_every_cuda_test_are_skipped_not_ok(tmp_path):
    """torch saw no GPU: pytest exits 0 with the CUDA tests skipped. The tests step says
    SKIPPED, and a GPU run (devcheck on cuda) fails: it ran no GPU test."""
    work = _work(tmp_path, dict.fromkeys(("setup", "tests", "devcheck", "tp1", "tp2"), 0))
    (work / "tests.log").write_text(NO_GPU_LOG)
    lines, ok = summary_lines(work)
    tests = next(x for x in lines if x.startswith("  CUDA tests: "))
    assert tests.startswith("  CUDA tests: SKIPPED (no CUDA test ran: 4 skipped, needs CUDA)")
    assert not ok and lines[-1] == "RESULT: FAILED"
    # A CPU dry run skips them by design: SKIPPED still, not OK, and the dry run passes.
    (work / "devcheck.json").write_text(json.dumps({**DEVCHECK, "device": "cpu", "gpu": None}))
    lines, ok = summary_lines(work)
    assert "  CUDA tests: SKIPPED (" in "\n".join(lines) and ok
    # A failing pytest stays FAILED, whatever it skipped.
    (work / "status" / "tests").write_text("1\n")
    assert "  CUDA tests: FAILED (exit 1)" in "\n".join(summary_lines(work)[0])


def test_run_prints_load_back_against_the_peak():
    import pandas as pd

    from bench.analysis.report import load_back_line

    requests = pd.DataFrame({"load_back_gbps": [40.0, None, 45.0]})
    assert load_back_line(requests, {"h2d_peak_gbps": 50.0}) == (
        "load-back: p50 42.5 GB/s over 2 load-backs (85% of the host->device peak 50.0 GB/s)")
    assert load_back_line(requests, {"h2d_peak_gbps": None, "h2d_reason": "no GPU"}) is None


@pytest.mark.long  # make test-long: the GPU script's whole dry run on CPU
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_passes_and_packs_results(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_DIR": str(tmp_path / "work"),
           "OUT": str(out)}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run"],
                          cwd=tmp_path, env=env, text=True, capture_output=True, timeout=880)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout
    assert "gpu_check summary: CPU dry run" in summary and summary.rstrip().endswith("RESULT: OK")
    for line in ("offline setup (PIP_NO_INDEX=1): OK", "CUDA tests: SKIPPED (no CUDA test ran",
                 "TP1 run [llama3-8b, cpu/gloo]: OK", "TP2 shared-GPU run",
                 "bad pages 0/0"):
        assert line in summary
    assert (out / "gpu_check_summary.txt").read_text() == summary
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
    assert "work/tp1/requests.csv" in names and "work/devcheck.json" in names
    assert not any("/venv" in n for n in names)
