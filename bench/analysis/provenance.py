"""Report lines saying where a run came from (env.json): commit, time, host, versions,
backend and layout, the data plane and the host->device link, and the GPUs or why there
are none.

The data-plane lines say which backend carried the model all-reduces (gloo on CUDA is not
an NCCL measurement), the model shape, and the host->device peak that each load-back's
achieved GB/s (requests.csv `load_back_gbps`) is to be read against.
"""

from __future__ import annotations


def _yes_no(value: object) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _git_line(git: dict) -> str:
    """'<sha> (dirty)' or 'unknown: <reason>'."""
    if not git.get("commit"):
        return f"unknown ({git.get('reason') or git.get('error') or 'no reason recorded'})"
    return f"`{git['commit']}`" + (" (dirty working tree)" if git.get("dirty") else " (clean)")


def _gpu_lines(gpu: dict) -> list[str]:
    """The GPUs NVML saw, their links and topology, or the reason there are none."""
    if not gpu.get("available"):
        return [f"- GPUs: none ({gpu.get('reason') or gpu.get('error') or 'no reason recorded'})"]
    lines = [f"- GPU driver: {gpu.get('driver_version')}"]
    for g in gpu.get("gpus", []):
        lines.append(f"- GPU {g.get('index')}: {g.get('name')}, {g.get('memory_total_mib')} MiB, "
                     f"PCI {g.get('pci_bus_id')}, NVLinks active {g.get('nvlink_active')}")
    for pair in gpu.get("topology", []):
        lines.append(f"- GPUs {pair['gpus'][0]}-{pair['gpus'][1]}: PCIe {pair.get('pcie')}, "
                     f"NVLink P2P {_yes_no(pair.get('nvlink_p2p'))}")
    return lines


def provenance_lines(env: dict | None) -> list[str]:
    """Markdown bullet lines describing where the run came from (env.json)."""
    if env is None:
        return ["env.json is missing: the provenance of this run is unknown."]
    v = env.get("versions", {})
    world = ", ".join(f"{k}={val}" for k, val in (env.get("world") or {}).items())
    return [
        f"- git commit: {_git_line(env.get('git', {}))}",
        f"- time (UTC): {env.get('utc_time')}",
        f"- host: {env.get('host')} ({env.get('platform')}); CPU: {env.get('cpu_model')}, "
        f"{env.get('cpu_count')} cores",
        f"- versions: Python {v.get('python')}, torch {v.get('torch')}, numpy {v.get('numpy')}, "
        f"gloo available {_yes_no(v.get('gloo_available'))}, NCCL {v.get('nccl') or 'none'}, "
        f"CUDA available {_yes_no(v.get('cuda_available'))}",
        f"- backend: {env.get('backend')}; world layout: {world or 'unknown'}",
        *data_plane_lines(env),
        *_gpu_lines(env.get("gpu") or {}),
    ]


def data_plane_lines(env: dict) -> list[str]:
    """Markdown bullets; empty for env.json files written before these facts existed."""
    lines = []
    if env.get("data_backend"):
        lines.append(f"- data plane (model all-reduces): {env['data_backend']}; model shape: "
                     f"{env.get('model', 'toy')}")
    if env.get("data_plane_note"):
        lines.append(f"- **{env['data_plane_note']}**")
    if "h2d_peak_gbps" in env:
        peak = env["h2d_peak_gbps"]
        lines.append(f"- host->device peak: {peak} GB/s (best of pinned copies of "
                     f"{env.get('h2d_bytes', 0) / 2**20:.0f} MiB, CUDA events); each "
                     f"load-back's achieved GB/s is `load_back_gbps` in requests.csv"
                     if peak else f"- host->device peak: none ({env.get('h2d_reason')})")
    return lines
