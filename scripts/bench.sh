#!/usr/bin/env bash
# Shared-prefix benchmarks (see docs/benchmarks.md). Usage:
#   scripts/bench.sh [OUT_DIR] [extra args for `python -m mmrl.bench`, e.g. --which update,e2e,scaling]
# Numbers to compare are ratios within one run: both layouts run interleaved in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/bench}"; shift || true
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# On a shared machine a spinning OpenMP thread whose partner was descheduled turns every
# parallel region into a wait: sleep at barriers instead (it costs nothing measurable here).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec "$PY" -m mmrl.bench --out "$OUT" --threads "${THREADS:-2}" "$@"
