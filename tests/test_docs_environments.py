"""docs/environments.md's complete environment runs as written: its module is cut out of the page,
imported as `my_envs`, named in a config, and driven through the trajectory loop on a tiny
Qwen2.5-VL with scripted turns: the dot moves, each observation is the new view, and the
`success` reward reads the info."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from PIL import Image

from mmrl import config
from mmrl.models import get_adapter
from mmrl.models.codec import Codec
from mmrl.rollout.environments import make_environments, prompt_features
from mmrl.rollout.trajectory import TrajectoryRollout
from mmrl.train.scoring import RewardSet
from mmrl.config import RewardSpec
from mmrl.types import Sample, SamplingParams
from tests.rollout.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def my_envs(tmp_path):
    page = (ROOT / "docs/environments.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    (tmp_path / "my_envs.py").write_text(code)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("my_envs", None)


def test_the_documented_environment_runs_through_the_loop(my_envs, tmp_path):
    Image.new("RGB", (224, 28), "white").save(tmp_path / "line.png")
    cfg = config.load(None, ["data.train=x.jsonl", "env.name=my_envs:Line", "env.args={width: 8}", "env.max_turns=4",
                             "env.max_tokens=600", "env.max_observation_tokens=200",
                             "rewards=[{name: my_envs:success}]"])
    _, codec = Codec.tiny(get_adapter("qwen2_5_vl"), seed=0)
    envs = make_environments(cfg, codec)
    sample = Sample(id="a", images=[str(tmp_path / "line.png")], fields={"start": 2, "goal": 4},
                    messages=[{"role": "user", "content": [
                        {"type": "image"}, {"type": "text", "text": "Move the dot to 4."}]}])
    from mmrl.data.media import load_image

    prompt = prompt_features(envs, codec, sample,
                             lambda s: {"images": [load_image(p) for p in s.images]})
    engine = ScriptedEngine(codec.tokenizer, [["right", "left"], ["right", "left"],
                                                  ["left"], ["left"]])
    loop = TrajectoryRollout.for_run(cfg, engine, codec, envs)
    batch = loop.rollout([prompt], SamplingParams(num_generations=2, max_new_tokens=20))
    good, bad = batch.trajectories
    assert good.turn_texts == ["right", "right"] and good.info == {"success": True, "moves": 2}
    (view,) = good.observations[0].media["images"]  # the dot at 3 after the first move
    assert view.getpixel((3 * 28 + 14, 14)) == (255, 0, 0)
    assert view.getpixel((2 * 28 + 14, 14)) == (255, 255, 255)
    assert "The dot is at 3." in good.observations[0].text
    assert bad.turn_texts == ["left"] * 4 and bad.hit_turn_cap  # 2 -> 1 -> 0 -> 0 -> 0
    assert bad.info == {"success": False, "moves": 4} and len(bad.observations) == 3
    _, per = RewardSet([RewardSpec(name="my_envs:success")]).score(
        [p.sample for p in batch.prompts], batch.texts, {"info": [t.info for t in
                                                                  batch.trajectories]})
    assert per["success"] == [1.0, 0.0]
