"""The one trajectory loop with environments (#58): single-turn is the engine's own generation bit
for bit (training's Rollout, evaluation); a stateful user environment ("module:Class", defined
here) that shows an image after each turn trains two real steps on a tiny Qwen2.5-VL, its
state and `info` reaching a reward; a step past env.timeout_s ends its trajectory; and no file
outside the loop calls an engine's generate."""
from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl import config
from mmrl.envs import Environment, Step
from mmrl.models.forward import generate
from mmrl.rollout.environments import Environments, make_environments
from mmrl.train.evaluate import evaluate
from mmrl.train.loop import Trainer
from mmrl.types import SamplingParams, Trajectory
from mmrl.validate import validate

ROOT = Path(__file__).resolve().parents[2]
CLOSED: list[int] = []  # Counter.close: the count each closed trajectory's environment reached


class Counter(Environment):
    """Counts the model's turns from the record's `start`; each step but the last shows the count
    as a grey image and text; done at `goal`. Its info: the moves made and every text it read."""

    def __init__(self, goal: int = 2):
        self.goal, self.count, self.read = goal, 0, []

    def reset(self, sample):
        self.count, self.read = int(sample.fields.get("start", 0)), []
        return sample

    def step(self, trajectory, text):
        self.count += 1
        self.read.append(text)
        info = {"moves": self.count, "read": list(self.read)}
        if self.count >= self.goal:
            return Step(done=True, info=info)
        grey = Image.new("RGB", (56, 56), (40 * self.count,) * 3)
        return Step(observation=[f"count {self.count}", grey], info=info)

    def close(self):
        CLOSED.append(self.count)


def moves(completions, solution, *, info, **fields):
    """A reward that reads the environment's info."""
    return [float(i.get("moves", 0)) for i in info]


def _prompts(t: Trainer, n: int):
    return [t.prompts.features(t.prompts.dataset[i]) for i in range(n)]


# ------------------------------------------------------------------ single-turn, bit for bit ---

@pytest.fixture(scope="module")
def single(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    path = tiny_config(root / "c.yaml", root / "data",
                       data={"eval": "{data}/eval.jsonl"}, rollout={"max_new_tokens": 8})
    return Trainer(config.load(path, [f"log.run_dir={root / 'run'}"]))


def test_single_turn_rollout_is_the_engine_generation_bit_for_bit(single):
    t = single
    prompts = _prompts(t, 2)
    assert not t.envs.trajectories  # single_turn: the first generation, no trajectory layout
    sampling = SamplingParams.from_rollout(t.cfg.rollout, suppress_ids=t.policy.codec.placeholder_ids)
    torch.manual_seed(5)
    batch = t.rollout.generate(prompts, group_offset=3)
    torch.manual_seed(5)
    ids, mask, slogp, truncated = t.rollout.engine.generate(prompts, sampling)
    assert torch.equal(batch.completion_ids, ids) and torch.equal(batch.completion_mask, mask)
    assert torch.equal(batch.sampler_logp, slogp) and batch.sampler_logp.dtype == slogp.dtype
    assert torch.equal(batch.truncated, truncated)
    tok = t.policy.codec.tokenizer
    assert batch.texts == tok.batch_decode([r[m.bool()] for r, m in zip(ids, mask)],
                                           skip_special_tokens=True)
    assert batch.group_ids.tolist() == [3, 3, 3, 3, 4, 4, 4, 4]
    assert batch.trajectories is None and batch.loss_mask is None
    assert all(p is q for p, q in zip(batch.prompts, [p for p in prompts for _ in range(4)]))


def test_single_turn_evaluation_is_the_model_generate_bit_for_bit(single):
    t, policy = single, single.policy
    samples = t.eval_set[:3]
    out = Path(t.run_dir) / "eval.jsonl"
    evaluate(policy.model, policy.codec, samples, t.cfg, out_file=out)
    result_rows = [json.loads(x) for x in out.read_text().splitlines()]
    feats = [t.prompts.features(s) for s in samples]
    params = SamplingParams(num_generations=1, max_new_tokens=t.cfg.rollout.max_new_tokens,
                            temperature=1.0, top_p=1.0, top_k=0, do_sample=False,
                            suppress_ids=policy.codec.placeholder_ids)
    policy.model.eval()
    ids, mask, _, _ = generate(policy.model, policy.codec.processor, feats, params)
    want = policy.codec.tokenizer.batch_decode([r[m.bool()] for r, m in zip(ids, mask)],
                                               skip_special_tokens=True)
    assert [r["completion"] for r in result_rows] == want


# ------------------------------------------------------------------ a stateful user env --------

def test_a_stateful_user_environment_trains_and_its_info_reaches_the_reward(tiny_config,
                                                                             tmp_path):
    where = f"{__name__}"
    path = tiny_config(
        tmp_path / "c.yaml", tmp_path / "data",
        model={"family": "qwen2_5_vl"}, rollout={"max_new_tokens": 4, "temperature": 1.0},
        env={"name": f"{where}:Counter", "args": {"goal": 2}, "max_turns": 3,
             "max_tokens": 200, "max_observation_tokens": 100},
        rewards=[{"name": f"{where}:moves"}, {"name": "mmrl_test_rewards:char_variety"}],
        sft={"steps": 8, "target": "ok", "lr": 0.01, "batch_size": 8, "eval_every": 8,
             "val_samples": 4})
    cfg = config.load(path, [f"log.run_dir={tmp_path / 'run'}"])
    t = Trainer(cfg)
    from mmrl.train.sft import sft_warmup  # the warm-up's prompts and evaluation: the env's
    sft_warmup(cfg, t.policy, t.prompts, t.log)
    CLOSED.clear()
    torch.manual_seed(0)
    batch, scores, per, _ = t.sample_batch()
    assert len(CLOSED) == batch.n  # one environment per trajectory, each closed
    stepped = 0
    for traj, text, cut in zip(batch.trajectories, batch.texts, batch.truncated.tolist()):
        read = traj.info.get("read", [])
        assert read == traj.turn_texts[:len(read)]  # the env read each finished turn, in order
        assert traj.info.get("moves", 0) == len(read)
        for k, obs in enumerate(traj.observations):  # count k+1 as a grey image, in the row
            (img,) = obs.media["images"]
            assert img.getpixel((0, 0)) == (40 * (k + 1),) * 3
            assert f"count {k + 1}" in obs.text
        stepped += bool(read)
        if traj.info.get("moves") == 2:
            assert len(traj.observations) == 1 and traj.turns == 2 and not cut
    assert stepped > 0, "no turn ended: the warm-up did not teach the end token"
    assert per["moves"] == [float(tr.info.get("moves", 0)) for tr in batch.trajectories]
    assert any(m == 2.0 for m in per["moves"])  # a trajectory saw an image and finished
    before = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    for _ in range(2):
        metrics = t.train_step()
    assert 0.0 <= metrics["reward/moves_mean"] <= 2.0 and metrics["turns/mean"] >= 1.0
    # a user environment logs its turns, and no tool-call metrics it has no calls for
    assert "turns/cap_frac" in metrics and not any(k.startswith("tools/") for k in metrics)
    changed = any(not torch.equal(before[k], v) for k, v in t.policy.model.named_parameters())
    assert changed
    t.close()


# ------------------------------------------------------------------ timeouts -------------------

class Slow(Environment):
    def __init__(self, seconds: float):
        self.seconds, self.closed = seconds, threading.Event()

    def step(self, trajectory, text):
        time.sleep(self.seconds)
        return Step(done=True, info={"slept": self.seconds})

    def close(self):
        self.closed.set()


def test_a_step_past_the_timeout_ends_its_trajectory_and_is_closed_when_it_returns():
    envs = Environments(Slow, name="slow", timeout_s=0.3, workers=4)
    slow, fast = [Slow(1.0), Slow(1.0)], Slow(0.0)
    started = time.monotonic()
    steps = envs.step([*slow, fast], [Trajectory()] * 3, ["a"] * 3)
    took = time.monotonic() - started
    assert took < 0.9  # the two slow steps ran at once, and were not waited for
    assert [s.info for s in steps] == [{"env_timeout": True}] * 2 + [{"slept": 0.0}]
    assert all(s.done for s in steps)
    envs.close([*slow, fast])  # the late ones are closed by their own threads, not here
    assert fast.closed.is_set() and not any(e.closed.is_set() for e in slow)
    assert all(e.closed.wait(2.0) for e in slow)


def test_a_failing_step_names_the_environment():
    class Broken(Environment):
        def step(self, trajectory, text):
            raise KeyError("no move")

    with pytest.raises(RuntimeError, match="env broken: step raised KeyError"):
        Environments(Broken, name="broken", timeout_s=1.0).step([Broken()], [Trajectory()], ["x"])


def test_env_names_resolve(tiny_config, tmp_path):
    path = tiny_config(tmp_path / "c.yaml", tmp_path / "data")
    cfg = config.load(path, [])
    assert cfg.env_name == "single_turn" and not cfg.multi_turn
    assert config.load(path, ["tools.use=[{name: crop}]"]).env_name == "tools"
    user = config.load(path, [f"env.name={__name__}:Counter", "env.args={goal: 3}"])
    envs = make_environments(user, None)
    assert envs.trajectories and envs.make().goal == 3 and user.multi_turn
    with pytest.raises(ValueError, match="env.name"):
        make_environments(config.load(path, ["env.name=nowhere_mod:Nope"]), None)
    bad = config.load(path, [f"env.name={__name__}:Counter", "env.args={gaol: 3}"])
    assert any(p.startswith("env: ") and "gaol" in p for p in validate(bad))
    with pytest.raises(config.ConfigError, match="tools are their own environment"):
        config.load(path, ["tools.use=[{name: crop}]", f"env.name={__name__}:Counter"])


# ------------------------------------------------------------------ the single path ------------

def _generate_calls(path: Path) -> list[str]:
    """`x.generate(...)` calls on an engine, and calls of the model-level generate functions."""
    tree, out = ast.parse(path.read_text()), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "generate" and \
                "engine" in ast.unparse(f.value):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(f)}")
        if isinstance(f, ast.Name) and f.id in ("generate", "generate_shared"):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} {f.id}")
    return out


def test_every_rollout_goes_through_the_one_trajectory_loop():
    """Training, the SFT warm-up, evaluation and the benchmarks sample through
    TrajectoryRollout only: no engine.generate and no model-level generate elsewhere."""
    loop = ROOT / "mmrl/rollout/trajectory.py"
    callers = [*(ROOT / "mmrl/train").glob("*.py"), *(ROOT / "mmrl/benchmarks").glob("*.py"),
               *(ROOT / "mmrl/rollout").glob("*.py"), ROOT / "mmrl/cli.py"]
    engines = {"hf.py", "vllm.py", "vllm_server.py", "vllm_io.py", "worker_ext.py"}
    found = [c for p in callers if p != loop and p.name not in engines
             for c in _generate_calls(p)]
    assert found == []
    assert len(_generate_calls(loop)) == 2  # the first turn, and every continuation
