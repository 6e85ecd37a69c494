"""Provenance of a run (env.json): code version, machine, software, world layout, GPU facts.

`collect_env` never raises: every fact it cannot learn is None (or `available: false`) with
the reason beside it, so a result file always says where it came from.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parents[2]  # the one definition: bench/rundir/env.py -> repo
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS: links 0..17
# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` names them.
TOPOLOGY_NAMES = {
    "NVML_TOPOLOGY_INTERNAL": "X (same device)",
    "NVML_TOPOLOGY_SINGLE": "PIX (one PCIe switch)",
    "NVML_TOPOLOGY_MULTIPLE": "PXB (several PCIe switches)",
    "NVML_TOPOLOGY_HOSTBRIDGE": "PHB (PCIe host bridge)",
    "NVML_TOPOLOGY_NODE": "NODE (host bridges within a NUMA node)",
    "NVML_TOPOLOGY_SYSTEM": "SYS (across NUMA nodes)",
}


def _git(args: list[str], cwd: Path) -> str:
    """stdout of one git command in `cwd`; raises on failure."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                           else f"git {args[0]} exited {done.returncode}")
    return done.stdout


def short_sha(cwd: Path = REPO_DIR) -> str:
    """HEAD's short commit, for folder names; "nogit" outside a repository."""
    try:
        return _git(["rev-parse", "--short", "HEAD"], cwd).strip() or "nogit"
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return "nogit"


def git_info(cwd: Path = REPO_DIR) -> dict[str, Any]:
    """{'commit': 40-hex or None, 'dirty': bool or None, 'reason': why unknown, or None}."""
    try:
        commit = _git(["rev-parse", "HEAD"], cwd).strip()
        dirty = bool(_git(["status", "--porcelain"], cwd).strip())
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return {"commit": None, "dirty": None, "reason": str(e) or type(e).__name__}
    return {"commit": commit, "dirty": dirty, "reason": None}


def git_branch(cwd: Path = REPO_DIR) -> str | None:
    """The checked-out branch's name; None on a detached HEAD or where git cannot say."""
    try:
        name = _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd).strip()
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return None
    return name if name and name != "HEAD" else None


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, else platform.processor(), else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def software_versions() -> dict[str, Any]:
    """Python, torch, numpy versions, gloo availability, NCCL version, CUDA availability."""
    import numpy

    out: dict[str, Any] = {"python": platform.python_version(), "numpy": numpy.__version__,
                           "torch": None, "torch_cuda": None, "gloo_available": None,
                           "nccl": None, "cuda_available": None}
    try:
        import torch
        import torch.distributed as dist

        out.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                   gloo_available=dist.is_available() and dist.is_gloo_available(),
                   cuda_available=torch.cuda.is_available())
        if torch.version.cuda is not None:  # only a CUDA build ships NCCL
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # noqa: BLE001 - provenance must not kill a run
        out["torch_error"] = f"{type(e).__name__}: {e}"
    return out


def _text(value: Any) -> str:
    """NVML strings are bytes in old bindings, str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvlinks(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    """State of each NVLink the GPU reports (links it does not have raise and are skipped)."""
    links = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED
        except nvml.NVMLError:
            continue
        links.append({"link": link, "active": bool(active)})
    return links


def _gpu_facts(nvml: Any, index: int, handle: Any) -> dict[str, Any]:
    """Name, memory, PCI bus and NVLink states of one GPU."""
    facts: dict[str, Any] = {"index": index, "name": _text(nvml.nvmlDeviceGetName(handle)),
                             "memory_total_mib": nvml.nvmlDeviceGetMemoryInfo(handle).total
                             // 2**20}
    try:
        facts["pci_bus_id"] = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    except nvml.NVMLError as e:
        facts["pci_bus_id"] = None
        facts["pci_reason"] = str(e)
    links = _nvlinks(nvml, handle)
    facts["nvlink"] = links
    facts["nvlink_active"] = sum(link["active"] for link in links)
    return facts


def _pair_topology(nvml: Any, handles: list[Any]) -> list[dict[str, Any]]:
    """PCIe path (common ancestor) and NVLink P2P support between each pair of GPUs."""
    names = {getattr(nvml, k): v for k, v in TOPOLOGY_NAMES.items() if hasattr(nvml, k)}
    pairs = []
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            pair: dict[str, Any] = {"gpus": [i, j]}
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                pair["pcie"] = names.get(level, f"level {level}")
            except nvml.NVMLError as e:
                pair["pcie"], pair["pcie_reason"] = None, str(e)
            try:
                status = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                                     nvml.NVML_P2P_CAPS_INDEX_NVLINK)
                pair["nvlink_p2p"] = status == nvml.NVML_P2P_STATUS_OK
            except (nvml.NVMLError, AttributeError) as e:
                pair["nvlink_p2p"], pair["nvlink_reason"] = None, str(e)
            pairs.append(pair)
    return pairs


def gpu_info() -> dict[str, Any]:
    """NVML facts of every GPU, or {'available': False, 'reason': ...} when there are none."""
    try:
        import pynvml as nvml
    except ImportError:
        return {"available": False, "reason": "pynvml not installed"}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:  # NVMLError_LibraryNotFound on a machine without a GPU driver
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(nvml.nvmlDeviceGetCount())]
        return {"available": bool(handles), "reason": None if handles else "no GPU found",
                "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
                "gpus": [_gpu_facts(nvml, i, h) for i, h in enumerate(handles)],
                "topology": _pair_topology(nvml, handles)}
    except Exception as e:  # noqa: BLE001 - NVMLError or a binding mismatch: say why
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _guarded(fn: Any, *args: Any) -> Any:
    """fn(*args), or {'error': ...} if it raised: collect_env must never raise."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def collect_env(backend: str, world: dict) -> dict[str, Any]:
    """Everything env.json records about a run. Never raises."""
    return {
        "git": _guarded(git_info),
        "utc_time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": _guarded(socket.gethostname),
        "platform": _guarded(platform.platform),
        "cpu_model": _guarded(cpu_model),
        "cpu_count": os.cpu_count(),
        "versions": _guarded(software_versions),
        "backend": backend,
        "world": dict(world),
        "gpu": _guarded(gpu_info),
    }
