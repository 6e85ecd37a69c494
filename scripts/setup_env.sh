#!/usr/bin/env bash
# Usage: bash scripts/setup_env.sh [--dev] [VENV_DIR]
#
# Creates the project's environment in VENV_DIR (default .venv) so that `make bench` runs,
# using $PYTHON (default python3). Required (pyproject.toml's dependencies): torch, numpy,
# pandas, matplotlib, nvidia-ml-py (pynvml). Optional (its extras stats and timeline): scipy
# and perfetto, installed wherever pip can; where it cannot (a GPU node as shipped, no
# package index) setup says one line for each and goes on: without scipy runs complete with
# exact counts and verdicts and empty intervals, without perfetto `bench timeline` writes no
# trace (its PNG still). Three cases, decided by what $PYTHON already imports:
# 1. Everything (a GPU node as shipped: CUDA torch, no package index, no ruff): no network,
#    no pip, no build. The venv sees $PYTHON's packages (--system-site-packages, plus a .pth
#    naming $PYTHON's site-packages when $PYTHON is itself a venv) and the project is put on
#    its path by a .pth file. Where `python -m venv` is missing, VENV_DIR/bin/python is a
#    wrapper that runs $PYTHON with the project on PYTHONPATH.
# 2. torch but not the rest: a venv with the system site-packages, then `pip install -e .`
#    adds what is missing; the torch already there satisfies torch>=2.4 and is never replaced.
# 3. No torch: a plain venv, the pinned CPU build torch==2.13.0 first (an unpinned torch
#    would resolve to a multi-GB CUDA build), then `pip install -e .`.
# --dev (make test, make lint, make gate; pyproject.toml's dev extra) adds pytest,
# pytest-benchmark, pytest-timeout and ruff, and makes scipy and perfetto required (the tests
# check intervals and traces), installing only those missing (the network is needed only
# then; setup fails where it cannot), and pytest-xdist where it can (make test runs serially
# without it). make mutate installs the mutate extra (mutmut) itself.
# `make setup` / `make bench` never install the dev tools.
set -euo pipefail
DEV=0
if [[ "${1:-}" == "--dev" ]]; then DEV=1; shift; fi
VENV=${1:-.venv}
PY=$(command -v "${PYTHON:-python3}")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNTIME="import torch, numpy, pandas, matplotlib, pynvml"
PIP=(-m pip install -q --disable-pip-version-check)

site_dirs() {  # a python's site-packages directories (purelib, platlib), one per line
  "$1" -c 'import sysconfig as s; p = s.get_paths(); print(*sorted({p["purelib"], p["platlib"]}), sep="\n")'
}

link_project() {  # the project importable without pip: a .pth file naming the repository
  echo "$ROOT" >"$(site_dirs "$VENV/bin/python" | head -1)/hicache_bench.pth"
}

wrapper() {  # no venv module: a python that is $PY with the project on its path
  mkdir -p "$VENV/bin"
  printf '#!/usr/bin/env bash\n# made by scripts/setup_env.sh: %s with the project on its path\nexport PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"\nexec "%s" "$@"\n' \
    "$PY" "$ROOT" "$PY" >"$VENV/bin/python"
  chmod +x "$VENV/bin/python"
}

offline_venv() {
  echo "setup: $PY already imports every runtime dependency: no pip, no network"
  if ! "$PY" -m venv --without-pip --system-site-packages "$VENV" 2>/dev/null; then
    echo "setup: no venv module; $VENV/bin/python wraps $PY"
    wrapper
    return
  fi
  if "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    # $PY is itself a venv: --system-site-packages sees its base, not its packages.
    site_dirs "$PY" >"$(site_dirs "$VENV/bin/python" | head -1)/base_env.pth"
  fi
  link_project
}

ensure_pip() {
  "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip -q
}

pip_venv() {
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: reusing the torch already importable by $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" "${PIP[@]}" torch==2.13.0
  fi
  ensure_pip
  "$VENV/bin/python" "${PIP[@]}" -e "$ROOT"
}

install_dev() {
  local missing=()
  for pair in pytest:pytest pytest_benchmark:pytest-benchmark pytest_timeout:pytest-timeout \
      scipy.stats:scipy perfetto.trace_builder.proto_builder:perfetto; do
    "$VENV/bin/python" -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
  done
  "$VENV/bin/python" -m ruff --version >/dev/null 2>&1 || missing+=(ruff)
  if ((${#missing[@]})); then
    echo "setup: installing dev tools: ${missing[*]}"
    ensure_pip
    "$VENV/bin/python" "${PIP[@]}" "${missing[@]}"
  fi
  # make test's two workers (docs/testing.md); without it the tests run one at a time
  "$VENV/bin/python" -c "import xdist" >/dev/null 2>&1 && return 0
  if "$VENV/bin/python" "${PIP[@]}" pytest-xdist >/dev/null 2>&1; then return 0; fi
  echo "setup: pytest-xdist is not installed and cannot be installed here: make test runs" \
    "every test in one process (slower, the same tests)"
}

if [[ ! -x "$VENV/bin/python" ]]; then
  if "$PY" -c "$RUNTIME" >/dev/null 2>&1; then offline_venv; else pip_venv; fi
elif ! "$VENV/bin/python" -c "$RUNTIME; import hicache, bench" >/dev/null 2>&1; then
  ensure_pip
  "$VENV/bin/python" "${PIP[@]}" -e "$ROOT"
fi
ensure_scipy() {  # the intervals' t quantiles (bench.stats); a pip-made venv gets it
  "$VENV/bin/python" -c "import scipy.stats" >/dev/null 2>&1 && return 0
  if [[ -x "$VENV/bin/pip" ]] && "$VENV/bin/python" "${PIP[@]}" scipy; then return 0; fi
  echo "setup: scipy is not installed and cannot be installed here: runs complete with exact" \
    "counts and verdicts, and every interval is empty (\"scipy is not installed\")"
}

ensure_perfetto() {  # `bench timeline`'s trace writer; a pip-made venv gets it
  "$VENV/bin/python" -c "import perfetto.trace_builder.proto_builder" >/dev/null 2>&1 && return 0
  if [[ -x "$VENV/bin/pip" ]] && "$VENV/bin/python" "${PIP[@]}" perfetto; then return 0; fi
  echo "setup: perfetto is not installed and cannot be installed here: runs complete (with" \
    "--timeline too); \`bench timeline\` writes its PNG but no trace"
}

if ((DEV)); then install_dev; else ensure_scipy; ensure_perfetto; fi
"$VENV/bin/python" -c "import torch, hicache, bench; print('setup: torch', torch.__version__, 'cuda', torch.cuda.is_available())"
