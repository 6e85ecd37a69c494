"""scripts/setup_env.sh on a machine like the GPU node as shipped: the interpreter already
imports every runtime dependency and there is no package index (PIP_NO_INDEX=1). Setup
must then need neither pip nor the network, and `python -m bench` must run from the result.
The interpreter used is this test's own (it has every dependency).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "setup_env.sh"
pytestmark = pytest.mark.slow  # each creates a venv and imports torch several times (~40 s)


def _setup(venv: Path, python: str, *flags: str,
           pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(["bash", str(SETUP), *flags, str(venv)], env=env, text=True,
                          capture_output=True, timeout=240)  # a loaded 2-core VM: 100-125 s


def _bench_help(venv: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "bench", "run", "--help"],
                          cwd=cwd, text=True, capture_output=True, timeout=60)


def no_scipy(tmp_path: Path, *also: str) -> Path:
    """A directory whose `scipy` (and the packages `also` names) fail to import, as on a
    node that lacks them."""
    for name in ("scipy", *also):
        (tmp_path / "hide" / name).mkdir(parents=True)
        (tmp_path / "hide" / name / "__init__.py").write_text(
            f"raise ImportError('{name} hidden by the test')\n")
    return tmp_path / "hide"


@pytest.mark.long  # make test-long: builds a venv offline (CI builds its own)
@pytest.mark.timeout(720)  # three setups, each importing torch several times
def test_offline_setup_needs_no_pip(tmp_path):
    # The GPU node as shipped: every dependency a run needs but scipy and perfetto, no
    # package index.
    venv = tmp_path / "venv"
    hidden = no_scipy(tmp_path, "perfetto")
    done = _setup(venv, sys.executable, pythonpath=hidden)
    assert done.returncode == 0, done.stderr
    assert "no pip, no network" in done.stdout
    assert "setup: scipy is not installed and cannot be installed here" in done.stdout
    assert "setup: perfetto is not installed and cannot be installed here" in done.stdout
    assert not (venv / "bin" / "pip").exists()  # nothing could have been downloaded
    helptext = _bench_help(venv, tmp_path)  # outside the repository: the .pth finds it
    assert helptext.returncode == 0 and "--model" in helptext.stdout
    # Dev tools already importable (this interpreter has them): --dev installs nothing.
    dev = _setup(venv, sys.executable, "--dev")
    assert dev.returncode == 0, dev.stderr
    assert "installing dev tools" not in dev.stdout
    # scipy and perfetto are the dev extra's: where they do not import, --dev installs them
    # (pip finds them satisfied here, since they are only hidden from imports).
    dev = _setup(venv, sys.executable, "--dev", pythonpath=hidden)
    assert "installing dev tools: scipy perfetto" in dev.stdout


@pytest.mark.timeout(200)
def test_without_a_venv_module_a_wrapper_runs_the_interpreter(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1 $2" = "-m venv" ] && exit 1\n'
                    f'exec "{sys.executable}" "$@"\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    done = _setup(venv, str(fake))
    assert done.returncode == 0, done.stderr
    assert "wraps" in done.stdout
    helptext = _bench_help(venv, tmp_path)
    assert helptext.returncode == 0 and "--data-backend" in helptext.stdout
