#!/usr/bin/env bash
# Several nodes with torchrun's c10d rendezvous. Run the same command on every node:
#   MASTER_ADDR=node0 NNODES=4 GPUS_PER_NODE=8 bash scripts/multinode.sh recipes/X.yaml [k=v ...]
# MASTER_PORT (default 29500) is the rendezvous port on MASTER_ADDR; RDZV_ID names the job (two
# jobs sharing an endpoint must differ). PYTHON picks the interpreter (default .venv's).
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
NNODES=${NNODES:?set NNODES}; GPUS_PER_NODE=${GPUS_PER_NODE:-8}; PORT=${MASTER_PORT:-29500}
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$PY" ] || PY=python
# On SIGTERM torchrun passes it to the workers and kills them this many seconds later (torch
# >= 2.13 reads it; older ones wait 30 s): time for the step in progress and the save.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-100}
exec "$PY" -m torch.distributed.run --nnodes="$NNODES" --nproc_per_node="$GPUS_PER_NODE" \
  --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$PORT" --rdzv_id="${RDZV_ID:-mmrl}" \
  -m mmrl.cli train "$@"
