"""Bad input: one clear line on stderr, exit code 2, no traceback, nothing written."""

import subprocess
import sys

import pytest
import torch

from bench.commands.run import main as main_run
from bench.plan.placement import out_dir

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
    (["--device", "cpu", "--data-backend", "nccl"], "--data-backend nccl needs --device cuda"),
    (["--kv-budget-gib", "0"], "--kv-budget-gib must be > 0"),
    (["--host-memory", "l3"], "invalid choice"),
    (["--repeat-seeds", "one"], "invalid choice"),
    (["--protocols", "sglang-0.5.18", "--host-memory", "buffer_only"],
     "host_memory buffer_only is not modelled for pre27010"),
    (["--protocols", "sglang-0.5.17"], "unknown protocol sglang-0.5.17"),
    (["--collective-delay-ms", "-1"], "--collective-delay-ms takes ms >= 0"),
    (["--collective-delay-ms", "slow"], "--collective-delay-ms takes ms >= 0"),
    (["--collective-delay-ms", "0,1,-0.5"], "--collective-delay-ms takes ms >= 0"),
    (["--collective-delay-ms", "nan"], "--collective-delay-ms takes ms >= 0"),
    (["--preset", "delay-sweep", "--collective-delay-ms", "0,inf"],
     "--collective-delay-ms takes ms >= 0"),
    (["--collective-delay-ms", "0,1", "--pairing", "duet"], "--pairing duet is not supported"),
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


def test_a_folder_holding_files_is_refused_and_kept(capsys, tmp_path):
    """A run's files left in --out (a failed run's failures.csv) would join the new run's
    report and end it FAILED; a folder with other files only is taken as it is."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "failures.csv").write_text("protocol,policy,repeat,error\n")
    assert main_run(["--repeats", "1", "--out", str(old)]) == 2
    assert "already holds a run's files (failures.csv)" in capsys.readouterr().err
    assert [p.name for p in old.iterdir()] == ["failures.csv"]  # nothing written, nothing lost
    beside = tmp_path / "beside"  # bench ab's console.log, written before its bench run
    beside.mkdir()
    (beside / "console.log").write_text("")
    assert out_dir(beside, "ci") == beside


def test_module_entry_point_exit_codes():
    run = [sys.executable, "-m", "bench"]
    bad = subprocess.run([*run, "run", "--protocols", "x"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert subprocess.run([*run, "frobnicate"], capture_output=True, timeout=60).returncode == 2
    helptext = subprocess.run([*run, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert helptext.returncode == 0 and "--protocols" in helptext.stdout


def _one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)


def test_nccl_on_fewer_gpus_than_ranks_is_refused_naming_gloo(capsys, tmp_path, monkeypatch):
    _one_gpu(monkeypatch)
    assert main_run(["--device", "cuda", "--tp", "2", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs 2 GPU(s)" in err and "--data-backend gloo" in err and "\n" not in err


def test_shared_gpus_with_gloo_data_plane(monkeypatch):
    from bench.commands.run import build_plan, parser
    from bench.plan.placement import resolve_data_backend, resolve_device

    _one_gpu(monkeypatch)
    assert resolve_device("cuda", 2, "gloo") == "cuda"
    assert resolve_device("auto", 2, "gloo") == "cuda"
    assert resolve_device("auto", 2) == "cpu"  # NCCL needs a GPU per rank
    assert resolve_data_backend("cuda", None) == "nccl"
    assert resolve_data_backend("cuda", "gloo") == "gloo"
    assert resolve_data_backend("cpu", None) == "gloo"
    plan = build_plan(parser().parse_args(["--model", "llama3-8b", "--kv-budget-gib", "2"]))
    cfg = plan.config(plan.cells()[0])
    assert (cfg.model, cfg.kv_budget_gib, plan.model) == ("llama3-8b", 2.0, "llama3-8b")


def test_budget_skew_with_a_real_forward_is_refused(capsys, tmp_path, monkeypatch):
    _one_gpu(monkeypatch)
    argv = ["--device", "cuda", "--data-backend", "gloo", "--model", "llama3-8b",
            "--budget-skew", "0.5", "--out", str(tmp_path / "r")]
    assert main_run(argv) == 2
    assert "--budget-skew needs --model toy on CUDA" in capsys.readouterr().err


def test_data_plane_facts_for_env_and_report():
    from bench.analysis.provenance import data_plane_lines
    from bench.run.plan import RunPlan
    from bench.run.sink import data_plane

    shared = data_plane(RunPlan(device="cuda", data_backend="gloo"))
    assert shared["data_backend"] == "gloo" and "not an NCCL measurement" in \
        shared["data_plane_note"]
    assert data_plane(RunPlan(device="cuda"))["data_backend"] == "nccl"
    assert data_plane(RunPlan(device="cuda"))["data_plane_note"] is None
    lines = data_plane_lines({**shared, "h2d_peak_gbps": 51.2, "h2d_bytes": 256 << 20})
    assert any("not an NCCL measurement" in x for x in lines)
    assert any("51.2 GB/s" in x and "256 MiB" in x for x in lines)
    assert data_plane_lines({}) == []
