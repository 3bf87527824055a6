#!/usr/bin/env bash
# Runs the learning table (docs/learning.md + docs/learning.png): every recipe, one run at a time.
#   bash research/learning_table.sh                       # all rows, seeds 0,1,2
#   bash research/learning_table.sh --rows detection --seeds 0
#   bash research/learning_table.sh --seeds 0,1,2,3,4 --eval-seed 101   # held-out records of seed 101
#   bash research/learning_table.sh --render-only           # rewrite both from learning_results.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"
export HF_HUB_OFFLINE=1
exec "$PY" research/learning_table.py "$@"
