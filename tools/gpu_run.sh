#!/usr/bin/env bash
# One GPU run, as the device machine runs it (in a copy of the working tree, with .whl carried):
#   bash tools/gpu_run.sh G1 "$OUT"
# Groups and estimates: docs/gpu-plan.md. Bring the results home with
#   .venv/bin/python -m helpers.gpu_run merge <files_at>/G1.tar.gz
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash tools/gpu_run.sh GROUP OUTDIR [--profile smoke] [--budget S]" >&2; exit 2; }
group=$1; out=$2; shift 2
PYTHON=${PYTHON:-python3}
mkdir -p "$out"
PYTHONUNBUFFERED=1 "$PYTHON" -m helpers.gpu_run "$group" --out "$out" "$@" 2>&1 | tee "$out/$group.log"
exit "${PIPESTATUS[0]}"
