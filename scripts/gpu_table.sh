#!/usr/bin/env bash
# One table's sweep on the GPU machine, in one command of under ten minutes (docs/gpu.md). Runs the table's sweeps
# (latentstruct.report.reproduce --only sweeps: JOBS runs at once with the joblib launcher, trainer.device=cuda,
# a checkpoint every 2 minutes), stops them cleanly MINUTES after the start (scripts/carry.py deadline: each run saves
# its step and records status interrupted), and packs the run records and the checkpoints that fit into $OUT
# (scripts/carry.py pack). Calling it again continues: the state carried in .device/state/<paper>-<table> (make
# gpu-stage T=...) is unpacked first, so completed runs are skipped and interrupted ones resume.
#
#   OUT=<dir> scripts/gpu_table.sh <paper>/<table> [--minutes 7] [--jobs N] [--seeds S] [--args '...'] [--device cuda]
#
# --seeds and --args are make table's SEEDS and ARGS (a subset of the table: --args '+experiment=sst_spigot').
# RUNS: where the runs go (default multirun). --device cpu runs the same here, without installing the bundle.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: OUT=<dir> $0 <paper>/<table> [--minutes 7] [--jobs N] [--seeds S] [--args '...'] [--device cuda|cpu]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
table=$1; shift
device=cuda minutes=7 jobs=$(nproc) seeds="" args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --args) args=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
: "${OUT:?set OUT to the folder that collects the results}"
mkdir -p "$OUT"
seconds=$(awk "BEGIN { print int($minutes * 60) }")
python=${PYTHON:-python3}
runs=${RUNS:-multirun}
state=.device/state/${table//\//-}
log=$(mktemp)
{
  if [ "$device" = cuda ]; then
    "$python" scripts/bundle.py install --bundle .device
  fi
  [ -d .device/data ] && export LATENTSTRUCT_DATA="$PWD/.device/data"
  [ -f .device/commit.txt ] && export LATENTSTRUCT_GIT_COMMIT="$(cat .device/commit.txt)"
  export PYTHONUNBUFFERED=1
  if [ -f "$state/records.tar.gz" ]; then
    "$python" -m scripts.carry unpack "$state" --runs "$runs"
  fi
  sweep=$("$python" -c "import sys; from latentstruct.report.reproduce import sweep_root; print(sweep_root(*sys.argv[1:]))" \
    "$table" "$runs")
  code=0
  "$python" -m scripts.carry deadline "$seconds" --claims "$sweep" -- \
    "$python" -m latentstruct.report.reproduce "$table" --only sweeps --runs "$runs" --jobs "$jobs" --seeds "$seeds" \
    --args "trainer.device=$device trainer.checkpoint_seconds=120 $args" || code=$?
  echo "the sweeps ended with status $code$( [ $code = 124 ] && echo ': stopped at the deadline' )"
  "$python" -m scripts.carry pack "$table" --runs "$runs" --out "$OUT" --log "$log"
} 2>&1 | tee "$log"
