"""`scripts/gpu_check.sh --cpu`: every stage of the GPU check runs at tiny sizes on the CPU and
writes its report, so the script a lent GPU runs in one go has not rotted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


# What mmrl's install has and the GPU image (the device tool's 'cuda' image: torch, transformers,
# accelerate, peft, pillow, ...) lacks, less what scripts/gpu_wheels.sh brings: the dry run
# imports none of it, as the real run there cannot (so it found qwen_vl_utils missing before
# the first H200 run; the wheels now bring it).
NOT_ON_GPU_IMAGE = ("av", "decord", "soxr", "soundfile", "_soundfile", "jiwer", "math_verify",
                    "latex2sympy2_extended", "vllm", "deepspeed", "librosa", "pycocotools",
                    "qwen_omni_utils")
# None in sys.modules: `import` raises ModuleNotFoundError and importlib.util.find_spec says
# absent, as transformers' availability probes ask.
BLOCKER = "import sys\nsys.modules.update(dict.fromkeys(%r))\n"


def test_gpu_check_cpu_dry_run_writes_every_section(tmp_path):
    site = tmp_path / "image"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER % (NOT_ON_GPU_IMAGE,))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu", "--out",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "gpu.json").read_text())
    stages = results["stages"]
    assert not [name for name, s in stages.items() if "failure" in s], \
        {name: s["failure"] for name, s in stages.items() if "failure" in s}
    for kernel, row in stages["correctness"]["kernels"].items():
        assert row["ok"], (kernel, row)
    for cell in stages["update"]["cells"]:
        assert all(cell[layout]["seconds"] > 0 for layout in ("naive", "shared", "varlen"))
    gen = stages["generation"]
    assert gen["hf_generate"]["tokens_per_s"] > 0 and gen["shared"]["tokens_per_s"] > 0
    decode = stages["decode"]
    assert decode["greedy_identical"] and decode["compiled"]["tokens_per_s"] > 0
    assert decode["compiles"] == 1 and decode["recompiles"] == 0
    step = stages["grpo step"]
    assert step["stages"]["step"] > 0 and step["measured_peak"] > 0
    assert 0.7 < step["predicted_peak"] / step["measured_peak"] < 1.3
    step_async = stages["async step"]
    assert step_async["k0"]["steps_per_s"] > 0 and step_async["k1"]["steps_per_s"] > 0
    trl = stages["trl"]
    assert "skipped" in trl or trl["ratio"] > 0
    text = (out / "gpu.md").read_text()
    for title in ("## Environment", "## Correctness on the device", "## Update phase",
                  "## Generation", "## Decode", "## One full GRPO step", "## The step with rollout.max_staleness",
                  "## TRL"):
        assert title in text
    assert "CPU dry run" in text


def _wheel(folder: Path, name: str) -> Path:
    """A minimal pure-Python wheel of package `name` (one module that says its name)."""
    import zipfile

    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", f"NAME = {name!r}\n")
        z.writestr(f"{name}-1.0.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{name}-1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return path


def test_gpu_wheels_downloads_and_gpu_site_installs_only_what_is_missing(tmp_path):
    """gpu_wheels.sh fetches the wheels it is told to (one small one here); gpu_site.py installs,
    offline, the brought wheels this Python cannot import and leaves the others alone."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    env = dict(os.environ, GPU_WHEELS="mdurl==0.1.2", GPU_WHEELS_DIR=str(wheels),
               PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_wheels.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.name for p in wheels.glob("*.whl")] == ["mdurl-0.1.2-py3-none-any.whl"]
    _wheel(wheels, "mmrl_gpu_site_probe")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_site.py"), str(wheels),
                           str(site)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "installing mmrl_gpu_site_probe" in proc.stdout and "mdurl" not in proc.stdout
    assert (site / "mmrl_gpu_site_probe" / "__init__.py").is_file()
    assert not (site / "mdurl").exists()  # importable here already: the image's own wins
