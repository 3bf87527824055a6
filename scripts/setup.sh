#!/usr/bin/env bash
# One-command install of mmrl into a virtual environment.
#
#   bash scripts/setup.sh            # CPU machine (default): venv in .venv, CPU torch, tests ready
#   bash scripts/setup.sh --gpu      # CUDA machine: CUDA torch + vLLM + deepspeed (+ flash-attn if it builds)
#   VENV=/path bash scripts/setup.sh # choose where the venv goes
#
# Why a script and not just `pip install -e .`: on CPU the torch wheel must be pinned (a bare
# `torch` pulls a multi-GB CUDA build), torchvision's PyPI wheel needs a small patch to import
# beside CPU torch, and torchaudio/torchcodec must be absent (their CUDA-linked wheels break every
# transformers processor import). See ../shared/ENVIRONMENT.md for the measurements behind this.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=cpu
for arg in "$@"; do
  case "$arg" in
    --gpu) MODE=gpu ;;
    --cpu) MODE=cpu ;;
    *) echo "usage: bash scripts/setup.sh [--cpu|--gpu]" >&2; exit 2 ;;
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
  $PIP install -q -e ".[test]"
  # Pulled in by some packages; CUDA-linked, and their presence breaks transformers on CPU.
  $PIP uninstall -q -y torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" scripts/patch_torchvision.py
else
  $PIP install -q torch torchvision
  $PIP install -q -e ".[test,gpu]"
  $PIP install -q flash-attn --no-build-isolation || echo "flash-attn did not build; mmrl falls back to sdpa"
fi

# Headless Chromium renders the HTML run report in the browser test (Debian package; no-op
# without apt or root, the test then skips and says why).
bash scripts/install_chromium.sh || true

"$VENV/bin/python" - <<'EOF'
import torch, torchvision, transformers, mmrl, rewards
print(f"mmrl ready: torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}, cuda={torch.cuda.is_available()}")
EOF
echo "activate with: source $VENV/bin/activate"
