#!/usr/bin/env bash
# Usage: bash scripts/setup_env.sh [VENV_DIR]
#
# Creates the project's virtual environment and installs hicache-bench into it.
# - If the interpreter already imports torch (e.g. a GPU node with a CUDA build), the venv
#   sees the system site-packages and that torch is reused, never replaced.
# - Otherwise the pinned CPU build torch==2.13.0 is installed first (an unpinned `torch`
#   would resolve to a multi-GB CUDA build).
set -euo pipefail
VENV=${1:-.venv}
PY=${PYTHON:-python3}
if "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: reusing the torch already importable by $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
  "$PY" -m venv --system-site-packages "$VENV"
else
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
fi
"$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev]'
"$VENV/bin/python" -c "import torch, hicache, bench; print('setup: torch', torch.__version__, 'cuda', torch.cuda.is_available())"
