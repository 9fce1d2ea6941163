#!/usr/bin/env bash
# The GPU machine's check in one command of under ten minutes (docs/gpu.md): latentstruct installed from the bundle
# (.device, make device-bundle), then scripts/gpu_check.py's steps (CUDA tests, every experiment on the device, host
# round trips, bench/structures, bench/implicit's two ways of making the energy methods' HVPs, the timing sheet). Everything goes to $OUT (8 files), the log to $OUT/check.log.
#
#   OUT=<dir> scripts/gpu_check.sh [--device cuda|cpu] [--minutes 8] [--only timing] [--timing-args '...']
#
# --only: the steps to run, comma-separated (the others are reported skipped); --timing-args: options added to the
# timing step's bench/tables.py (a session that only times the tables an earlier check did not reach).
# --device cpu is the dry run here: every step but the CUDA ones, in a venv that sees only the GPU image's packages
# (scripts/bundle.py venv) with the bundle installed into it. PYTHON: the interpreter to start from (default python3;
# on the GPU machine, the one that has torch).
set -euo pipefail
cd "$(dirname "$0")/.."
device=cuda
minutes=8  # the steps' deadline; the install before it and the files after it fit in 10
only=
timing_args=
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --timing-args) timing_args=$2; shift 2 ;;
    *) echo "usage: OUT=<dir> $0 [--device cuda|cpu] [--minutes 8] [--only STEPS] [--timing-args '...']" >&2
       exit 2 ;;
  esac
done
: "${OUT:?set OUT to the folder that collects the results}"
[ -f .device/commit.txt ] || { echo "error: no bundle in .device: run make device-bundle first" >&2; exit 2; }
mkdir -p "$OUT"
deadline=$(( $(date +%s) + ${minutes%.*} * 60 ))
python=${PYTHON:-python3}
work=$(mktemp -d)
unset PYTHONPATH  # latentstruct and its requirements come from the install below, nothing else
{
  if [ "$device" = cpu ]; then
    python=$("$python" scripts/bundle.py venv "$work/venv")
    echo "dry run in $work/venv, which sees only the GPU image's packages"
  fi
  "$python" scripts/bundle.py install --bundle .device --bench-target "$work/bench"
  export LATENTSTRUCT_DATA="$PWD/.device/data" LATENTSTRUCT_GIT_COMMIT="$(cat .device/commit.txt)"
  export PYTHONUNBUFFERED=1
  "$python" -m scripts.gpu_check --device "$device" --out "$OUT" --deadline "$deadline" --bench-path "$work/bench" \
    ${only:+--only "$only"} --timing-args="$timing_args"
} 2>&1 | tee "$OUT/check.log"
