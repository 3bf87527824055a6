#!/usr/bin/env bash
# Several nodes with torchrun's c10d rendezvous. Run the same command on every node:
#   MASTER_ADDR=node0 NNODES=4 GPUS_PER_NODE=8 bash scripts/multinode.sh recipes/X.yaml [k=v ...]
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the first node's address}"
NNODES=${NNODES:?set NNODES}; GPUS_PER_NODE=${GPUS_PER_NODE:-8}; PORT=${MASTER_PORT:-29500}
PY=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$PY" ] || PY=python
exec "$PY" -m torch.distributed.run --nnodes="$NNODES" --nproc_per_node="$GPUS_PER_NODE" \
  --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$PORT" --rdzv_id="${RDZV_ID:-mmrl}" \
  -m mmrl.cli train "$@"
