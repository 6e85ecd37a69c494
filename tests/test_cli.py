"""Bad input: one clear line on stderr, exit code 2, no traceback, nothing written."""

import subprocess
import sys

import pytest
import torch

from bench.cli import main_run

BAD = [
    (["--protocols", "pr99999"], "unknown protocol pr99999"),
    (["--policies", "eventually"], "unknown policy eventually"),
    (["--tp", "2", "--pp", "2", "--nproc", "2"], "--nproc 2 does not match --tp 2 x --pp 2"),
    (["--rate", "0"], "--rate must be > 0"),
    (["--rate", "-3"], "--rate must be > 0"),
    (["--requests", "0"], "--requests must be > 0"),
    (["--repeats", "-1"], "--repeats must be > 0"),
    (["--fail-rate", "1.5"], "fail_rate"),
    (["--budget-skew", "1"], "--budget-skew must be < 1"),
    (["--step-ms", "-5"], "--step-ms must be >= 0"),
    (["--kill-rank", "5"], "--kill-rank 5 is not a rank"),
    (["--preset", "nope"], "invalid choice"),
    (["--device", "tpu"], "invalid choice"),
    (["--requests", "many"], "invalid int value"),
    (["--output-tokens", "0"], "--output-tokens must be > 0"),
    (["--max-running", "0"], "--max-running must be > 0"),
    (["--bystanders", "-1"], "--bystanders must be >= 0"),
    (["--bystander-rate", "0"], "--bystander-rate must be > 0"),
    (["--storage-gbps", "0"], "--storage-gbps must be > 0"),
    (["--model", "gpt5"], "invalid choice"),
    (["--gpu", "tpu"], "invalid choice"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_option_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    out = tmp_path / "run"
    assert main_run([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()  # validated before anything is written


def test_cuda_without_gpus_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main_run(["--device", "cuda", "--out", str(tmp_path / "r")]) == 2
    assert "--device cuda needs 2 GPU(s)" in capsys.readouterr().err


def test_cuda_without_nccl_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert main_run(["--device", "cuda", "--out", str(tmp_path / "r")]) == 2
    assert "needs NCCL" in capsys.readouterr().err


def test_step_ms_on_cuda_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert main_run(["--device", "cuda", "--step-ms", "7", "--out", str(tmp_path / "r")]) == 2
    assert "on CUDA the forward is real" in capsys.readouterr().err


def test_unwritable_output_directory(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main_run(["--out", str(blocker / "run")]) == 2
    assert "cannot write results to" in capsys.readouterr().err


def test_module_entry_point_exit_codes():
    run = [sys.executable, "-m", "bench"]
    bad = subprocess.run([*run, "run", "--protocols", "x"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert subprocess.run([*run, "frobnicate"], capture_output=True, timeout=60).returncode == 2
    helptext = subprocess.run([*run, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert helptext.returncode == 0 and "--protocols" in helptext.stdout
