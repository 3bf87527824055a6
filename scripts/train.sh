#!/usr/bin/env bash
# One node, N processes (GPUs, or CPU processes with gloo):
#   bash scripts/train.sh 8 recipes/quickstart.yaml model.path=/ckpt/Qwen2.5-VL-3B-Instruct
# Each process draws the same global batch of rollout.prompts_per_step prompts and keeps its
# slice (prompts_per_step must be divisible by N); gradients are summed across processes.
set -euo pipefail
NPROC=${1:?usage: train.sh NPROC CONFIG [key=value ...]}; shift
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$PY" ] || PY=python
# On SIGTERM torchrun passes it to the workers and kills them this many seconds later (torch
# >= 2.13 reads it; older ones wait 30 s): time for the step in progress and the save.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-100}
exec "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" -m mmrl.cli train "$@"
