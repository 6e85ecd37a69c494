#!/usr/bin/env bash
# Usage: scripts/gpu_check.sh [--dry-run]
#
# One prepared check of the CUDA paths on a GPU node, from the repository root as shipped:
# `PYTHONPATH=. python3 -m bench ...`, no venv, no network, no ruff (Python with torch+CUDA,
# pandas, matplotlib, pytest, nvidia-ml-py preinstalled). Each step has a time limit; the
# limits add up to under 6 minutes (a run on one H200 should take 2-3).
#   setup     scripts/setup_env.sh into a scratch venv with PIP_NO_INDEX=1 (`make setup`
#             offline: must need neither pip nor the network)
#   tests     the CUDA tests and their CPU neighbours: tests/test_gpu_model.py,
#             tests/test_loadback.py, tests/test_pools.py (not the slow ones); SKIPPED, not
#             OK, and RESULT: FAILED when every CUDA test skipped (torch sees no GPU)
#   devcheck  `python -m bench devcheck measure`: host->device peak (pinned 256 MiB, and
#             pageable), one request's load-back of 20 real llama3-8b pages (8 MiB each) with
#             achieved GB/s and checksums, llama3-8b TP1 forward decode (batch 1, 32) and
#             prefill (512, 2048 tokens) times
#   tp1       `bench run --device cuda --tp 1 --model llama3-8b` (ci preset, 16 requests,
#             before/after, wait_complete): real forward, real KV bytes, NCCL data plane
#   tp2       the same at TP2 with `--data-backend gloo`: two ranks share the GPU
# then prints a short summary (decode and prefill times, load-back GB/s vs the H2D peak,
# TP2 shared-GPU run OK/FAILED) and ends with RESULT: OK or FAILED (exit 0 or 1).
#
# --dry-run runs the same steps on CPU (gloo, toy-shaped forward, llama3-8b shapes in the
# runs), with 3x the time limits, so the script is tested off a GPU (tests/test_gpu_check.py).
# Results go to $GPU_CHECK_DIR (default results/gpu_check_<UTC>); when $OUT is set they are
# also packed into $OUT/gpu_check.tar.gz with the summary beside it. PYTHON picks the
# interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
PY=${PYTHON:-python3}
WORK=${GPU_CHECK_DIR:-results/gpu_check_$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$WORK/status"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
RUN=(--preset ci --repeats 1 --protocols before,after --policies wait_complete --bystanders 8
     --output-tokens 32)
TESTS=(tests/test_gpu_model.py tests/test_loadback.py tests/test_pools.py)
if ((DRY)); then
  SCALE=3 DEV=cpu FWD_MODEL=toy
  TP1=(--device cpu --tp 1 --model llama3-8b)
  TP2=(--device cpu --tp 2 --model llama3-8b)
else
  SCALE=1 DEV=cuda FWD_MODEL=llama3-8b
  TP1=(--device cuda --tp 1 --model llama3-8b)
  TP2=(--device cuda --tp 2 --data-backend gloo --model llama3-8b)
fi

step() {  # step NAME SECONDS CMD...: CMD under a time limit; its output and exit code kept
  local name=$1 limit=$(($2 * SCALE))
  shift 2
  echo "gpu_check: $name (limit ${limit}s) ..." >&2
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$rc" >"$WORK/status/$name"
  echo "gpu_check: $name exit $rc: $(tail -n 1 "$WORK/$name.log")" >&2
}

step setup 45 env PIP_NO_INDEX=1 PYTHON="$PY" bash scripts/setup_env.sh "$WORK/venv"
# -rs: the skip reasons, so the summary can say SKIPPED when every CUDA test skipped
step tests 100 "$PY" -m pytest -q -rs -o addopts="" -p no:cacheprovider -m "not slow" "${TESTS[@]}"
step devcheck 45 "$PY" -m bench devcheck measure --device "$DEV" --model "$FWD_MODEL" \
  --out "$WORK/devcheck.json"
step tp1 75 "$PY" -m bench run "${RUN[@]}" "${TP1[@]}" --requests 16 --out "$WORK/tp1"
step tp2 90 "$PY" -m bench run "${RUN[@]}" "${TP2[@]}" --requests 8 --out "$WORK/tp2"

"$PY" -m bench devcheck summary "$WORK" | tee "$WORK/summary.txt"
rc=${PIPESTATUS[0]}
if [[ -n "${OUT:-}" ]]; then
  tar czf "$OUT/gpu_check.tar.gz" --exclude=venv -C "$(dirname "$WORK")" "$(basename "$WORK")"
  cp "$WORK/summary.txt" "$OUT/gpu_check_summary.txt"
  echo "gpu_check: packed $OUT/gpu_check.tar.gz" >&2
fi
exit "$rc"
