"""The methods from the papers through the real trainer on a tiny offline Qwen2.5-VL counting
task: majority-vote rewards see their groups, filtered prompts are skipped or down-weighted, and
the ground-truth row is in the batch with the right tokens, reward and soft advantage."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrl import algos, config
from mmrl.train.loop import Trainer
from rewards.label_free import majority_error, majority_vote

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def tiny_yaml(tiny_config, tmp_path_factory) -> Path:
    """Prompts with an odd count get a varying reward, the others a constant 0 (uninformative);
    6 prompts, so that 3 steps of 2 revisit them."""
    root = tmp_path_factory.mktemp("tiny_methods")
    return tiny_config(root / "tiny.yaml", root / "data",
                       data={"generate_kwargs": {"n_train": 6, "n_eval": 2}},
                       rewards=[{"name": "mmrl_test_rewards:odd_variety"}], train={"steps": 3})


def _trainer(tiny_yaml: Path, run_dir: Path, *overrides: str) -> Trainer:
    return Trainer(config.load(tiny_yaml, [f"log.run_dir={run_dir}", *overrides]))


def _capture_update(t: Trainer, logprobs: bool = False) -> list:
    """Record each ScoredBatch the update sees (and, optionally, the policy's logprobs of its
    rows before the update changes the weights)."""
    seen, learner = [], t.learner
    update = learner.update

    def capture(sb, step):
        seen.append(sb)
        if logprobs:
            sb.policy_logp = t.policy.logprobs(sb.rollout)
        return update(sb, step)

    learner.update = capture
    return seen


def test_majority_vote_reward_sees_groups_and_logs_majority_error(tiny_yaml, tmp_path):
    t = _trainer(tiny_yaml, tmp_path, "rewards=[{name: majority_vote}]")
    seen = _capture_update(t)
    metrics = t.train_step()
    b = seen[0].rollout
    gids = b.group_ids.tolist()
    assert seen[0].per_reward["majority_vote"] == majority_vote(b.texts, [None] * b.n, group_id=gids)
    known, wrong = majority_error(b.texts, [p.sample.solution for p in b.prompts], gids)
    assert known == 2 and metrics["label_free/majority_wrong"] == wrong / 2
    t.log.close()


def test_history_skip_drops_uninformative_prompts_and_logs_kept_fraction(tiny_yaml, tmp_path):
    t = _trainer(tiny_yaml, tmp_path, "algo.history_epochs=1", "algo.history_mode=skip")
    seen = _capture_update(t)
    first = [t.train_step() for _ in range(3)]  # one epoch over the 6 prompts
    assert all(m["history/kept_frac"] == 1.0 for m in first)
    dataset, history = t.prompts.dataset, t.prompts.history.history
    even = {s.id for s in dataset if int(s.solution) % 2 == 0}
    odd = {s.id for s in dataset} - even
    assert even and len(odd) >= 2, "the generated set must hold both kinds for this test"
    assert {k for k in history.flags if history.filtered(k)} == even
    m = t.train_step()  # epoch 2: every even prompt is skipped
    ids = {p.sample.id for p in seen[-1].rollout.prompts}
    assert ids <= odd
    # 2 prompts kept; the kept fraction = 2 / (2 + even prompts drawn before them)
    skipped = round(2 / m["history/kept_frac"]) - 2
    assert 1 <= skipped <= len(even) and m["history/kept_frac"] == pytest.approx(2 / (2 + skipped))
    assert t.prompts.state_dict()["prompt_history"]["k"] == 1  # saved with the checkpoint
    t.log.close()


def test_history_downweight_scales_filtered_prompts_advantages(tiny_yaml, tmp_path):
    advs = []
    for i, extra in enumerate([[], ["algo.history_epochs=1", "algo.history_mode=downweight",
                                    "algo.history_weight=0.25"]]):
        t = _trainer(tiny_yaml, tmp_path / str(i), *extra)
        if t.prompts.history is not None:  # every prompt filtered before the step
            t.prompts.history.history.flags = {s.id: [True] for s in t.prompts.dataset}
        seen = _capture_update(t)
        torch.manual_seed(0)
        t.train_step()
        advs.append(seen[0].advantages)
        t.log.close()
    assert advs[0].abs().sum() > 0
    torch.testing.assert_close(advs[1], advs[0] * 0.25)


def test_ground_truth_row_replaces_a_failed_groups_last_rollout(tiny_yaml, tmp_path):
    t = _trainer(tiny_yaml, tmp_path, "rewards=[{name: count}]", "algo.gt_threshold=0.5",
                 "algo.gt_template='<answer>{solution}</answer>'", "algo.gt_alpha_pos=1.0",
                 "algo.gt_alpha_neg=1.0", "algo.gt_tau=1.0")
    seen = _capture_update(t, logprobs=True)
    metrics = t.train_step()
    sb = seen[0]
    b, tok = sb.rollout, t.policy.codec.tokenizer
    last = [max(i for i in range(b.n) if b.group_ids[i] == g) for g in b.group_ids.unique()]
    for r in last:  # a tiny random model never counts right: every group fires
        want = tok(f"<answer>{b.prompts[r].sample.solution}</answer>",
                   add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        n = int(b.completion_mask[r].sum())
        assert b.completion_ids[r, :n].tolist() == want and n == len(want)
        assert sb.per_reward["count"][r] == 1.0 and sb.scores[r] == 1.0
    assert metrics["gt_guidance/fired_frac"] == 1.0
    # The advantage is the group advantage of the soft-reshaped rewards: 1 stays 1, 0 -> 2 - e.
    shaped = algos.soft_rewards(sb.scores, 1.0, 1.0, 1.0)
    torch.testing.assert_close(sb.advantages, algos.compute_advantages("grpo", shaped, b.group_ids))
    # Its "sampler" logprobs are the current policy's (the HF engine returns sampler logprobs).
    rows = torch.tensor(last)
    torch.testing.assert_close(b.sampler_logp[rows], sb.policy_logp[rows], atol=1e-5, rtol=0)
    t.log.close()


def test_tgrpo_samples_shuffled_videos_and_adds_the_bonus(tiny_config, tmp_path):
    path = tiny_config(tmp_path / "video.yaml", tmp_path / "video_data", name="tiny_video",
                       data={"generate": "video_qa", "generate_kwargs": {"n_train": 4, "n_eval": 2},
                             "video_nframes": 4, "video_fps": None},
                       rollout={"num_generations": 3, "max_new_tokens": 5}, train={"steps": 1})
    # mu = 0: the ordered group always "wins", so every row with accuracy > 0.1 gets alpha.
    t = _trainer(path, tmp_path, "algo.tgrpo_alpha=0.3", "algo.tgrpo_mu=0.0")
    calls, generate = [], t.rollout.generate
    t.rollout.generate = lambda prompts, **kw: (calls.append(prompts), generate(prompts, **kw))[1]
    seen = _capture_update(t)
    metrics = t.train_step()
    sb = seen[0]
    assert len(calls) == 2 and len(calls[1]) == 2, "one shuffled rollout of both video prompts"
    for ordered, shuffled in zip(calls[0], calls[1]):
        a, b = ordered.media["videos"][0].frames, shuffled.media["videos"][0].frames
        assert sorted(map(bytes, a)) == sorted(map(bytes, b)) and a.tolist() != b.tolist()
    acc = torch.tensor(sb.per_reward["char_variety"])
    torch.testing.assert_close(sb.scores, acc + 0.3 * (acc > 0.1).float())
    assert metrics["tgrpo/extra_rollout_frac"] == 1.0  # video rollouts doubled
    assert metrics["tgrpo/bonus_rows"] == float((acc > 0.1).sum())
    t.log.close()


def test_think_hybrid_asks_both_modes_and_logs_their_shares(tiny_yaml, tmp_path):
    from mmrl.data.prepare import asks_nothink
    from rewards.thinking import think_format, think_shares
    t = _trainer(tiny_yaml, tmp_path, "data.think_hybrid=0.5", "rewards=[{name: think_format}]",
                 "rollout.prompts_per_step=6")
    seen = _capture_update(t)
    metrics = t.train_step()
    b = seen[0].rollout
    asked = [p.sample.fields["think_mode"] for p in b.prompts]
    for p, mode in zip(b.prompts, asked):
        assert (mode == "no_think") == asks_nothink(p.sample.id, 0.5, t.cfg.train.seed)
        text = p.sample.messages[-1]["content"][-1]["text"]
        want = t.cfg.data.nothink_instruction if mode == "no_think" else t.cfg.data.think_instruction
        assert text.endswith(want)
        assert want in t.policy.codec.tokenizer.decode(p.input_ids)
    assert seen[0].per_reward["think_format"] == think_format(b.texts, [None] * b.n, think_mode=asked)
    assert metrics["think/none"] == think_shares(b.texts)["none"]
    for mode in set(asked):
        assert metrics[f"think/asked_{mode}_frac"] == asked.count(mode) / b.n
    t.log.close()


def test_sft_warm_up_imitates_the_think_target_where_the_hybrid_asked_to_think(tiny_yaml,
                                                                                 tmp_path):
    from mmrl.data.prepare import asks_nothink
    from mmrl.train.sft import target_text
    t = _trainer(tiny_yaml, tmp_path, "data.think_hybrid=0.5",
                 "sft.think_target='<think>I count.</think><answer>{solution}</answer>'")
    # Held-out prompts are asked as training asks them (by id), with the same instruction.
    from mmrl.data.prepare import build_datasets
    cfg = config.load(tiny_yaml, [f"log.run_dir={tmp_path}", "data.think_hybrid=0.5",
                                  f"data.eval={t.cfg.data.train}"])
    for s in build_datasets(cfg, 28)[1]:
        mode = "no_think" if asks_nothink(s.id, 0.5, t.cfg.train.seed) else "think"
        want = t.cfg.data.nothink_instruction if mode == "no_think" else t.cfg.data.think_instruction
        assert s.fields["think_mode"] == mode and s.messages[-1]["content"][-1]["text"].endswith(want)
    _, samples, feats = t.prompts.load(list(range(len(t.prompts.dataset))))
    modes = [s.fields["think_mode"] for s in samples]
    assert set(modes) == {"think", "no_think"}  # both modes among the 6 ids at share 0.5
    tok = t.policy.codec.tokenizer
    for s, f, mode in zip(samples, feats, modes):
        want = t.cfg.data.think_instruction if mode == "think" else t.cfg.data.nothink_instruction
        assert want in tok.decode(f.input_ids)  # the prompt asked what the target answers
        assert target_text(t.cfg.sft, s) == (f"<think>I count.</think><answer>{s.solution}</answer>"
                                             if mode == "think" else f"<answer>{s.solution}</answer>")
    t.log.close()


def test_history_is_saved_and_restored_with_the_prompt_source(tiny_yaml, tmp_path):
    over = ["algo.history_epochs=1", "algo.history_mode=skip", "train.save_every=1"]
    t = _trainer(tiny_yaml, tmp_path, *over)
    t.train_step()
    t.save()
    flags = dict(t.prompts.history.history.flags)
    assert flags, "the step observed its prompts"
    t.close()
    r = _trainer(tiny_yaml, tmp_path, *over, "train.resume=auto")
    assert r.step == 1 and r.prompts.history.history.flags == flags
    r.close()
