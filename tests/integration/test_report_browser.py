"""The HTML report as a real browser renders it: headless Chromium screenshot + DOM dump.

Needs /usr/bin/chromium (scripts/install_apt.sh chromium); skips with that hint otherwise.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.report import build_report, synthetic

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="/usr/bin/chromium not found: run scripts/install_apt.sh chromium"),
]
# Flags: no sandbox (containers run as root), no GPU, and nothing that phones home, so the run
# is offline-safe and deterministic.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    run = synthetic.write_synthetic_run(root / "runA")
    return build_report([run])


def test_screenshot_is_not_blank(report, tmp_path):
    shot = tmp_path / "shot.png"
    proc = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000",
                     report.as_uri())
    assert shot.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (2000, 1280)
    assert pixels.std() > 20  # a blank or error page is one flat colour
    # the dark header bar renders at the top: the stylesheet was applied
    assert pixels[:40, :400].mean() < 80


def test_dom_has_sections_plots_and_drawn_boxes(report, tmp_path):
    proc = _chromium(tmp_path, "--dump-dom", report.as_uri())
    dom = proc.stdout
    assert dom, proc.stderr[-2000:]
    for section in ("summary", "curves", "rollouts"):
        assert f'id="{section}"' in dom
    assert len(re.findall(r'<img class="plot" src="data:image/png;base64,', dom)) >= 15
    assert re.search(r'<img class="media-img drawn-boxes" src="data:image/png;base64,', dom)
    assert re.search(r'<img class="media-video" src="data:image/png;base64,', dom)
    assert 'class="missing"' in dom
    # the injected completion stayed text: no element was created from it
    assert "&lt;script&gt;alert(" in dom and "<img src=\"x\"" not in dom


def test_step_link_opens_its_details(report, tmp_path):
    dom = _chromium(tmp_path, "--dump-dom", report.as_uri() + "#run0-step-30").stdout
    assert re.search(r'<details class="step" id="run0-step-30" open="">', dom)
    assert not re.search(r'<details class="step" id="run0-step-20" open', dom)
