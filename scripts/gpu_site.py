"""Install, offline, the wheels in WHEELS_DIR whose packages this Python cannot import, into
SITE_DIR (added to PYTHONPATH after the repo by scripts/gpu_check.sh). A package the image already
has is left alone: its own build (e.g. a CUDA one) wins.

    python scripts/gpu_site.py .gpu_wheels .gpu_site
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path


def top_level(wheel: Path) -> list[str]:
    """The importable top-level names a wheel installs (from its file list)."""
    names = set()
    with zipfile.ZipFile(wheel) as z:
        for item in z.namelist():
            head = item.split("/")[0]
            if head.endswith((".dist-info", ".data")):
                continue
            names.add(head[:-3] if head.endswith(".py") else head)
    return sorted(n for n in names if n.isidentifier())


def main(wheels: str, site: str) -> int:
    missing = []
    for wheel in sorted(Path(wheels).glob("*.whl")):
        names = top_level(wheel)
        if names and all(importlib.util.find_spec(n) is None for n in names):
            missing.append(wheel)
    if not missing:
        print("gpu_site: every brought wheel is already importable here")
        return 0
    print("gpu_site: installing " + ", ".join(w.name.split("-")[0] for w in missing))
    return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                            "--no-deps", "--target", site, *map(str, missing)])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
