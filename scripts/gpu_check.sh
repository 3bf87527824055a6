#!/usr/bin/env bash
# The GPU check: numbers at real size in one command (~7.5 minutes on one H200), written as
# docs/gpu.md (docs/gpu.md and docs/memory.md say what each section means).
#
#   bash scripts/gpu_check.sh                  # on a GPU: writes docs/gpu.md and docs/gpu.json
#   bash scripts/gpu_check.sh --out DIR        # ... into DIR instead
#   bash scripts/gpu_check.sh --cpu            # every stage at tiny sizes on the CPU (CI)
#   bash scripts/gpu_check.sh --out DIR --stages "decode,async step"   # only these (and the
#                                              # environment); merge DIR/gpu.json by hand
#
# It needs only torch, transformers, accelerate and what a GPU image usually holds. Python
# packages the image lacks are installed, offline, from wheels brought along in .gpu_wheels/
# (built beforehand with `bash scripts/gpu_wheels.sh` on a machine with network), into
# .gpu_site/, and only those the image cannot import.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .gpu_wheels ]; then
  "$PY" scripts/gpu_site.py .gpu_wheels .gpu_site
  export PYTHONPATH="$PYTHONPATH:$PWD/.gpu_site"
fi
exec "$PY" -m mmrl.bench.gpu_check "$@"
