"""The `bench` parent plans a run without importing torch on a CPU build (bench.run.gpus):
the version module's text decides, and the answer is the one torch itself gives."""

import subprocess
import sys

import pytest

from bench.run.gpus import says_cpu_only
from tests.scratch_git import REPO

CPU = "cuda: Optional[str] = None\ngit_version = 'abc'\nhip: Optional[str] = None\n"
CUDA = "cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n"
ROCM = "cuda: Optional[str] = None\nhip: Optional[str] = '6.4.1'\n"
OLD_STYLE = "cuda = None\nhip = None\n"


@pytest.mark.parametrize("text, cpu", [(CPU, True), (CUDA, False), (ROCM, False),
                                       (OLD_STYLE, True), ("", False)])
def test_version_text_decides(text, cpu):
    assert says_cpu_only(text) is cpu


def _python(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_parent_plans_without_torch_and_agrees_with_torch(tmp_path):
    out = _python(
        "import sys\n"
        "import bench.commands.ab, bench.commands.compare, bench.commands.gate\n"
        "from bench.commands.run import resolve_plan\n"
        "from bench.run.gpus import gpus_and_nccl\n"
        "plan = resolve_plan(['--preset', 'ci', '--out', sys.argv[1]])\n"
        "before = gpus_and_nccl()\n"
        "print('torch' in sys.modules, plan.device)\n"
        "import torch\n"
        "gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(before == (gpus, torch.distributed.is_nccl_available()))\n", str(tmp_path))
    imported, agrees = out.splitlines()[-2:]
    assert agrees == "True"
    import torch

    if torch.version.cuda is None and torch.version.hip is None:
        assert imported.startswith("False"), out  # a CPU build: torch never imported
