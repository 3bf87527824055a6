"""grid_nav with `view: video` on the tiny recipe: the warm-up's demonstration walks step the
real environment, each move comes back as a 2-frame clip encoded as video (pixel_values_videos,
one temporal patch) at its place in the walk, and the training forward reads it: the logprobs
of the turns after a clip change when its frames do, and the turns before it do not."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mmrl import config
from mmrl.envs.grid_nav import render
from mmrl.train.loop import Trainer
from mmrl.train.sft import Demonstrations

pytestmark = pytest.mark.integration


def test_the_move_clips_reach_the_training_forward(tmp_path):
    recipe = "recipes/grid_nav/"
    cfg = config.load(recipe + "config.yaml", [
        recipe + "tiny.yaml", f"log.run_dir={tmp_path / 'run'}", "log.tensorboard=false",
        f"data.train={tmp_path / 'train.jsonl'}", f"data.eval={tmp_path / 'eval.jsonl'}",
        "env.args={view: video}", "log.progress=off"])
    t = Trainer(cfg)
    try:
        feats = [t.prompts.features(t.prompts.dataset[i], i) for i in range(4)]
        batch = Demonstrations(cfg, t.policy, t.envs).demonstrate(feats)
        for p, tr in zip(feats, batch.trajectories):  # 3 moves: a clip after each of the first 2
            grid = p.sample.fields["grid"]
            assert tr.turns == 3 and len(tr.observations) == 2 and tr.info["success"] == 1.0
            at, walked = tuple(grid["start"]), set()
            for obs, move in zip(tr.observations, p.sample.fields["moves"]):
                (clip,) = obs.media["videos"]  # from where it stood to where it is
                assert np.array_equal(clip.frames[0], np.asarray(render(grid, at, walked)))
                walked.add(at)
                nxt = (at[0] + (move == "down"), at[1] + (move == "right"))
                assert np.array_equal(clip.frames[1], np.asarray(render(grid, nxt, walked)))
                assert obs.tensors["video_grid_thw"].tolist() == [[1, 2, 2]]  # 1 temporal patch
                assert "pixel_values" not in obs.tensors  # a clip, not an image
                at = nxt
        logp = t.policy.logprobs(batch)
        dark = [dataclasses.replace(tr, observations=[
            dataclasses.replace(o, tensors={**o.tensors, "pixel_values_videos":
                                            torch.zeros_like(o.tensors["pixel_values_videos"])})
            for o in tr.observations]) for tr in batch.trajectories]
        changed = t.policy.logprobs(dataclasses.replace(batch, trajectories=dark))
        for i, tr in enumerate(batch.trajectories):
            first = tr.observations[0].start  # the first turn: before any clip
            model = batch.policy_mask[i].bool()
            assert torch.equal(logp[i, :first], changed[i, :first])
            after = model.clone()
            after[:first] = False
            assert float((logp[i] - changed[i])[after].abs().max()) > 1e-4
    finally:
        t.close()
