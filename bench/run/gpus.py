"""How many CUDA devices torch sees here, and whether it has NCCL, for planning a run.

A CPU build of torch has neither, and says so in its version module (`cuda` and `hip`
None), which a file read answers without importing torch: about 1.5 s off every
`bench run`'s parent process, which otherwise never needs torch (its ranks do). With a
CUDA or ROCm build, or with torch already imported, torch itself is asked.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path

_NONE = r"^{}\s*(:[^=]*)?=\s*None\s*$"


@functools.cache
def cpu_only_build() -> bool:
    """True when the installed torch is a CPU build (no CUDA, no ROCm); False when it may
    see a GPU or its version module cannot be read (then torch is asked)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False  # importing torch will say what is wrong
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return False
    return says_cpu_only(text)


def says_cpu_only(version_py: str) -> bool:
    """Whether torch/version.py's text is a CPU build's: `cuda` and `hip` both None."""
    return all(re.search(_NONE.format(name), version_py, re.M) for name in ("cuda", "hip"))


def gpus_and_nccl() -> tuple[int, bool]:
    """(CUDA devices visible, NCCL available), asked of torch unless it is a CPU build."""
    if "torch" not in sys.modules and cpu_only_build():
        return 0, False
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus, torch.distributed.is_nccl_available()
