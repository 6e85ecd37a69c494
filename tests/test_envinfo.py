"""Provenance (env.json) and the atomic writers of bench/rundir/files.py."""

import csv
import json
import re
import sys
import types

import pytest

from bench.rundir import env as envinfo
from bench.rundir.files import GrowingCsv, atomic_open, write_csv_atomic, write_json_atomic

WORLD = {"world_size": 2, "tp": 2, "pp": 1, "nnodes": 1}


@pytest.fixture(scope="module")
def env():
    return envinfo.collect_env("gloo", WORLD)


def test_git_commit_or_reason(env):
    git = env["git"]
    if git["commit"] is None:
        assert git["reason"]
    else:
        assert re.fullmatch(r"[0-9a-f]{40}", git["commit"])
        assert isinstance(git["dirty"], bool)


def test_not_a_repo_gives_a_reason(tmp_path):
    git = envinfo.git_info(tmp_path)
    assert git["commit"] is None and git["dirty"] is None
    assert git["reason"]


def test_machine_and_versions(env):
    assert env["backend"] == "gloo"
    assert env["world"] == WORLD
    assert env["host"] and env["utc_time"].endswith("+00:00")
    versions = env["versions"]
    assert versions["python"].count(".") == 2
    assert versions["torch"] and versions["numpy"]
    assert isinstance(versions["gloo_available"], bool)
    json.dumps(env)  # serialisable as is


def test_gpu_unavailable_here_says_why(env):
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        pytest.skip("this machine has a GPU")
    assert env["gpu"]["available"] is False
    assert env["gpu"]["reason"]


def test_pynvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert envinfo.gpu_info() == {"available": False, "reason": "pynvml not installed"}


class FakeNVMLError(Exception):
    pass


def fake_pynvml(n_gpus=2, links=4):
    """A stand-in for pynvml: n GPUs on one PCIe switch, each with `links` active NVLinks."""
    m = types.SimpleNamespace(NVMLError=FakeNVMLError, NVML_FEATURE_ENABLED=1,
                              NVML_TOPOLOGY_SINGLE=10, NVML_P2P_CAPS_INDEX_NVLINK=2,
                              NVML_P2P_STATUS_OK=0, shutdown_calls=0)

    def link_state(handle, link):
        if link >= links:
            raise FakeNVMLError("Not Supported")
        return 1

    def shutdown():
        m.shutdown_calls += 1

    m.nvmlInit = lambda: None
    m.nvmlShutdown = shutdown
    m.nvmlDeviceGetCount = lambda: n_gpus
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlSystemGetDriverVersion = lambda: b"560.35"
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=141 * 2**30)
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"0000:0{h}:00.0")
    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 10
    m.nvmlDeviceGetP2PStatus = lambda a, b, idx: 0
    return m


def test_gpu_facts_from_nvml(monkeypatch):
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = envinfo.gpu_info()
    assert gpu["available"] is True and gpu["driver_version"] == "560.35"
    assert [g["name"] for g in gpu["gpus"]] == ["NVIDIA H200"] * 2
    assert gpu["gpus"][0]["memory_total_mib"] == 141 * 1024
    assert gpu["gpus"][1]["nvlink_active"] == 4 and len(gpu["gpus"][1]["nvlink"]) == 4
    assert gpu["topology"] == [{"gpus": [0, 1], "pcie": "PIX (one PCIe switch)",
                                "nvlink_p2p": True}]
    assert fake.shutdown_calls == 1


def test_nvml_init_failure(monkeypatch):
    fake = fake_pynvml()

    def fail():
        raise FakeNVMLError("NVML Shared Library Not Found")

    fake.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = envinfo.gpu_info()
    assert gpu["available"] is False and "Not Found" in gpu["reason"]


def test_write_json_atomic(tmp_path):
    path = tmp_path / "env.json"
    write_json_atomic(path, {"a": 1, "b": None})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["env.json"]  # no temp file left


def test_write_csv_atomic_cells(tmp_path):
    path = tmp_path / "rows.csv"
    write_csv_atomic(path, [{"x": True, "y": None, "z": float("nan")}, {"x": False, "z": 1.5}],
                     ["x", "y", "z"])
    assert list(csv.reader(path.open())) == [["x", "y", "z"], ["True", "", ""],
                                             ["False", "", "1.5"]]
    with pytest.raises(ValueError):
        write_csv_atomic(path, [{"w": 1}], ["x"])
    assert path.read_text().startswith("x,y,z")  # the failed write left the old file


def test_growing_csv_matches_whole_writes(tmp_path):
    """Each add leaves the file write_csv_atomic would write of every row so far (quoting of
    commas and newlines included); a bad row leaves the file as the last add wrote it."""
    grown, whole = tmp_path / "grown.csv", tmp_path / "whole.csv"
    cols = ["x", "y"]
    log = GrowingCsv(grown, cols)
    so_far: list[dict] = []
    for rows in ([], [{"x": 1, "y": "a,b"}], [{"x": "two\nlines"}, {"y": 2.5}]):
        log.add(rows)
        so_far += rows
        write_csv_atomic(whole, so_far, cols)
        assert grown.read_bytes() == whole.read_bytes()
    with pytest.raises(ValueError):
        log.add([{"w": 1}])
    assert grown.read_bytes() == whole.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grown.csv", "whole.csv"]


def test_atomic_open_failure_keeps_old_file(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("new")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
