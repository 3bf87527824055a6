#!/usr/bin/env bash
# Download, on a machine with network, the pure-Python wheels (and a few small binary ones for
# CPython 3.12 on x86_64 Linux) that scripts/gpu_check.sh may need on a GPU image without them:
#   bash scripts/gpu_wheels.sh          # -> .gpu_wheels/ (ignored by git, ~25 MB)
# The device runner carries .gpu_wheels with the repository (64 MiB in all); gpu_site.py there
# installs only what the image cannot import. Versions are those the CPU stack here runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
OUT=${GPU_WHEELS_DIR:-.gpu_wheels}
mkdir -p "$OUT"
common=(--no-deps --only-binary=:all: --dest "$OUT" --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform any)
# mmrl's own imports at train time (omegaconf, rich, pillow) and TRL with what datasets needs.
# GPU_WHEELS overrides the list; GPU_WHEELS_DIR the folder.
default="omegaconf==2.4.0 antlr4-python3-runtime==4.13.2 rich==15.0.0 markdown-it-py==4.3.0
  mdurl==0.1.2 pygments==2.21.0 pillow==13.0.0 trl==1.16.0 datasets==5.2.0 dill==0.4.1
  multiprocess==0.70.19 xxhash==4.1.0 fsspec==2026.9.0 pandas==3.1.1 python-dateutil==4.0.0
  tzdata==2026.6 qwen-vl-utils==0.0.14"
# shellcheck disable=SC2086
"$PY" -m pip download "${common[@]}" ${GPU_WHEELS:-$default}
du -sh "$OUT"
