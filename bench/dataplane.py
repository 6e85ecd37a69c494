"""Report lines about the data plane and the host->device link (env.json facts).

Kept apart from report.py: which backend carried the model all-reduces (gloo on CUDA is
not an NCCL measurement), the model shape, and the host->device peak that each load-back's
achieved GB/s (requests.csv `load_back_gbps`) is to be read against.
"""

from __future__ import annotations


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
