"""The non-launcher scripts in scripts/, each run at its smallest size (launchers:
test_launchers.py; research/'s scripts: tests/research/). The first test keeps it so: a script in
scripts/ or research/ that no test names fails it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
ENV = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
           HF_HUB_OFFLINE="1")


def _run(cmd, cwd=None, env=ENV, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_every_script_is_run_by_a_test():
    tests = "".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    scripts = [p for d in (SCRIPTS, ROOT / "research") for p in d.rglob("*")
               if p.suffix in (".sh", ".sbatch", ".py")]
    assert len(scripts) >= 10
    # Run by name, imported and called (the learning table's harness), or named as a
    # "research.module:function" the CLI loads (the search rows' generators)
    unrun = [str(p.relative_to(ROOT)) for p in scripts
             if f'"{p.name}"' not in tests and f"import {p.stem}  " not in tests
             and f"research.{p.stem}:" not in tests]
    assert not unrun, f"no test runs {unrun}"


def test_setup_sh_rejects_unknown_options():
    proc = _run(["bash", SCRIPTS / "setup.sh", "--bogus"])
    assert proc.returncode == 2 and "usage: bash scripts/setup.sh" in proc.stderr


def test_install_apt_sh_skips_installed_and_never_fails(tmp_path):
    (tmp_path / "fakeprog").write_text("#!/bin/sh\n")
    (tmp_path / "fakeprog").chmod(0o755)
    env = dict(ENV, PATH=str(tmp_path))  # no apt-get on this PATH
    script = SCRIPTS / "install_apt.sh"
    done = _run(["/bin/bash", script, "fakeprog"], env=env)
    assert done.returncode == 0 and "fakeprog already installed" in done.stdout
    missing = _run(["/bin/bash", script, "fakeprog", "nosuchprog"], env=env)
    assert missing.returncode == 0 and "apt-get not available; install nosuchprog" in missing.stderr


def test_patch_torchvision_guards_nms_once(tmp_path):
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    meta = pkg / "_meta_registrations.py"
    meta.write_text('import torch\n@torch.library.register_fake("torchvision::nms")\n'
                    "def nms(a, b, c):\n    pass\n")
    env = dict(ENV, PYTHONPATH=str(tmp_path))
    assert _run([sys.executable, SCRIPTS / "patch_torchvision.py"], env=env).returncode == 0
    once = meta.read_text()
    assert ('@(torch.library.register_fake("torchvision::nms") if '
            "torchvision.extension._has_ops() else (lambda f: f))") in once
    assert once.startswith("import torchvision.extension")
    assert _run([sys.executable, SCRIPTS / "patch_torchvision.py"], env=env).returncode == 0
    assert meta.read_text() == once  # idempotent


def test_prepare_librispeech(tmp_path):
    chapter = tmp_path / "LibriSpeech" / "19" / "198"
    chapter.mkdir(parents=True)
    (chapter / "19-198.trans.txt").write_text("19-198-0000 HELLO WORLD\n19-198-0001 GONE\n")
    (chapter / "19-198-0000.flac").write_bytes(b"")  # only the path is written, never decoded
    out = tmp_path / "asr.jsonl"
    proc = _run([sys.executable, SCRIPTS / "prepare" / "librispeech.py", tmp_path / "LibriSpeech", out])
    assert proc.returncode == 0, proc.stderr
    assert "missing 19-198-0001.flac" in proc.stderr
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["id"] == "19-198-0000" and rec["solution"] == "hello world"
    assert rec["audios"] == [str((chapter / "19-198-0000.flac").resolve())]


def test_prepare_coco_captions(tmp_path):
    ann = {"images": [{"id": 7, "file_name": "a.jpg", "width": 64, "height": 48},
                      {"id": 8, "file_name": "b.jpg", "width": 9, "height": 9}],
           "annotations": [{"image_id": 7, "caption": f" cap {i} "} for i in range(6)]}
    (tmp_path / "ann.json").write_text(json.dumps(ann))
    out = tmp_path / "cap.jsonl"
    proc = _run([sys.executable, SCRIPTS / "prepare" / "coco_captions.py", tmp_path / "ann.json",
                 tmp_path / "img", out])
    assert proc.returncode == 0, proc.stderr
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]  # image 8: no caption
    assert rec["solution"] == [f"cap {i}" for i in range(5)] and rec["image_size"] == [64, 48]
    assert rec["images"] == [str((tmp_path / "img" / "a.jpg").resolve())]


def test_bench_media_cache_second_epoch_decodes_nothing(tmp_path):
    out = tmp_path / "m.json"
    proc = _run([sys.executable, SCRIPTS / "bench_media_cache.py", "--n", 1, "--size", 32,
                 "--seconds", 0.5, "--out", out])
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert (res["decodes_epoch1"], res["decodes_epoch2"], res["hits_epoch2"]) == (2, 0, 2)


def test_bench_sh_quick_update(tmp_path):
    proc = _run(["bash", SCRIPTS / "bench.sh", tmp_path / "b", "--which", "update", "--quick",
                 "--trials", 1], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "update" in json.loads((tmp_path / "b" / "bench.json").read_text())


def test_bench_data_load_streams_what_it_draws(tmp_path):
    out = tmp_path / "d.json"
    proc = _run([sys.executable, SCRIPTS / "bench_data_load.py", "--n", 1200, "--draw", 8,
                 "--out", out])
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["stream"]["records"] == res["eager"]["records"] == 1200
    # Streaming decoded only the drawn images; reading whole wrote every distinct one (256).
    assert 1 <= res["stream"]["images_written"] <= 8 and res["eager"]["images_written"] == 256


def test_bench_data_scale_measures_inspect_and_a_short_run(tmp_path):
    out = tmp_path / "rows.json"
    proc = _run([sys.executable, SCRIPTS / "bench_data_scale.py", "--sizes", "40",
                 "--out", out], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["what"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"inspect", "train"}
    for row in rows.values():  # each measured in its own process, which exited cleanly
        assert row["records"] == 40 and row["exit"] == 0 and row["peak_rss_mb"] > 50, row


def test_bench_webdataset_opens_draws_and_inspects_its_shards(tmp_path):
    out = tmp_path / "wds.json"
    proc = _run([sys.executable, SCRIPTS / "bench_webdataset.py", "--samples", 30, "--shards", 3,
                 "--what", "open,draw", "--out", out], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["what"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"open", "draw"}
    assert rows["draw"]["images"] == 30 and rows["draw"]["records_per_s"] > 0, rows
    assert all(r["samples"] == 30 and r["shards"] == 3 and r["peak_rss_mb"] > 50
               for r in rows.values()), rows
