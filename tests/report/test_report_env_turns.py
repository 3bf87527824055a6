"""An environment's trajectory in the run's logs and report: `rollout_records` writes each
observation's media (which no file holds: the world drew them) under the run -- an image as a
PNG, a clip's frames side by side, a waveform as a 16 kHz WAV -- and the report shows each after
the turn it answered: the image, the clip's frames in order, the audio's picture. A tool
trajectory writes nothing (the report redraws its media from the originals)."""
from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import soundfile as sf
import torch
from PIL import Image

from mmrl.report import build_report
from mmrl.train.rollout_utils import rollout_records
from mmrl.types import (Observation, PromptFeatures, RolloutBatch, Sample, ScoredBatch,
                        ToolCallRecord, Trajectory, Video)

RED, DARK, LIGHT = (220, 30, 30), (20, 20, 20), (240, 240, 240)
TURNS = ["<answer>right</answer>", "<answer>down</answer>", "<answer>down</answer>"]


def _batch(trajectories: list[Trajectory]) -> ScoredBatch:
    n = len(trajectories)
    prompts = [PromptFeatures(sample=Sample(id=f"w{i}", messages=[], task="walk"), tensors={})
               for i in range(n)]
    batch = RolloutBatch(prompts=prompts, completion_ids=torch.zeros(n, 4, dtype=torch.long),
                         completion_mask=torch.ones(n, 4, dtype=torch.long),
                         group_ids=torch.arange(n), sampler_logp=None,
                         texts=[t.turn_texts[-1] for t in trajectories],
                         truncated=torch.zeros(n, dtype=torch.bool), trajectories=trajectories)
    zero = torch.zeros(n)
    return ScoredBatch(batch, zero, {}, zero)


def _walk() -> Trajectory:
    image = Image.new("RGB", (24, 24), RED)
    frames = np.stack([np.full((16, 16, 3), DARK, np.uint8), np.full((16, 16, 3), LIGHT, np.uint8)])
    clip = Video(frames=frames, fps=2.0, timestamps=[0.0, 0.5], duration=1.0)
    wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)).astype(np.float32)
    return Trajectory(turns=3, turn_texts=TURNS, observations=[
        Observation(start=5, length=9, tensors={}, media={"images": [image]}),
        Observation(start=20, length=11, tensors={}, media={"videos": [clip], "audios": [wave]})])


def _pngs(page: str, cls: str) -> list[np.ndarray]:
    pat = re.compile(r'<img class="([^"]*)" src="data:image/png;base64,([^"]+)"')
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(m.group(2)))).convert("RGB"))
            .astype(int) for m in pat.finditer(page) if cls in m.group(1).split()]


def test_an_environments_observations_are_written_and_drawn_after_their_turns(tmp_path):
    tool = Trajectory(turns=2, turn_texts=["call", "<answer>x</answer>"],
                      calls=[ToolCallRecord("crop", {}, 0)],
                      observations=[Observation(start=3, length=4, tensors={},
                                                media={"images": [Image.new("RGB", (8, 8))]})])
    media_dir = tmp_path / "rollout_media" / "step_000001"
    walk, called = rollout_records(_batch([_walk(), tool]), 2, media_dir)
    assert "media" not in called["observations"][0]  # a tool's: redrawn from the originals
    assert sorted(p.name for p in media_dir.rglob("*") if p.is_file()) == [
        "obs0_image0.png", "obs1_audio0.wav", "obs1_video0.png"]
    (image,), (clip, audio) = (o["media"] for o in walk["observations"])
    assert image["kind"] == "image" and np.all(np.asarray(Image.open(image["path"])) == RED)
    strip = np.asarray(Image.open(clip["path"]))
    assert (clip["kind"], clip["frames"], clip["fps"], strip.shape) == ("video", 2, 2.0, (16, 32, 3))
    assert np.all(strip[:, :16] == DARK) and np.all(strip[:, 16:] == LIGHT)  # frames in order
    samples, sr = sf.read(audio["path"])
    assert sr == 16000 and len(samples) == 8000 and audio["seconds"] == 0.5

    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"step": 1, **walk}) + "\n")
    page = build_report([tmp_path]).read_text()
    at = [page.index(s) for s in ("&lt;answer&gt;right", 'class="obs-image"', "&lt;answer&gt;down",
                                  'class="obs-video"', 'class="obs-audio"')]
    assert at == sorted(at) and page.count("observation: ") == 2
    (shown_image,) = _pngs(page, "obs-image")
    assert np.abs(shown_image - RED).max() <= 2
    (shown_clip,) = _pngs(page, "obs-video")
    row = shown_clip[shown_clip.shape[0] // 2]
    w = row.shape[0]
    assert np.abs(row[w // 4] - DARK).max() <= 4 and np.abs(row[3 * w // 4] - LIGHT).max() <= 4
    assert "2 frames at 2.0 fps" in page and "0.5s audio it heard" in page
