"""The warm-up on demonstration trajectories (`sft.turn_targets`): each model turn is a target
filled from the record, the real `crop` tool answers the call in between, and the loss covers the
model's turns only; the looked_at reward on what the real crops read, and the warm-up's stop on
it. On a tiny Qwen2.5-VL and `mmrl data generate visual_search` records."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from mmrl import config
from mmrl.train.loop import Trainer
from mmrl.tools.metrics import call_fields
from mmrl.train.sft import Demonstrations, sft_warmup
from rewards.looked_at import looked_at

CALL = '{{"bbox_2d": {patch_box_resized}}}'
ANSWER = "<answer>{solution}</answer>"


@pytest.fixture(scope="module")
def trainer(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    path = tiny_config(
        root / "demos.yaml", root / "data",
        data={"generate": "visual_search", "image_max_pixels": 3136,
              "generate_kwargs": {"n_train": 16, "n_eval": 2, "size": 448, "patch": 24,
                                  "cell": 1}},
        rollout={"max_new_tokens": 32},
        tools={"use": [{"name": "crop"}],
               "call_format": "json_box", "max_turns": 2, "max_tokens": 128,
               "max_observation_tokens": 64},
        sft={"steps": 2, "eval_every": 2, "batch_size": 4, "val_samples": 2,
             "turn_targets": [CALL, ANSWER]})
    t = Trainer(config.load(path, [f"log.run_dir={root / 'run'}"]))
    yield t
    t.close()


def test_a_demonstration_is_the_targets_around_the_real_tools_answer(trainer):
    tok, samples = trainer.policy.codec.tokenizer, trainer.prompts.dataset[:3]
    feats = [trainer.prompts.features(s) for s in samples]
    batch = Demonstrations(trainer.cfg, trainer.policy).demonstrate(feats)
    for i, s in enumerate(samples):
        call = tok.encode('{"bbox_2d": %s}' % s.fields["patch_box_resized"],
                          add_special_tokens=False) + [tok.eos_token_id]
        answer = tok.encode(f"<answer>{s.solution}</answer>", add_special_tokens=False) + [
            tok.eos_token_id]
        traj = batch.trajectories[i]
        (obs,) = traj.observations
        assert obs.start == len(call) and traj.turns == 2 and not traj.calls[0].error
        n = len(call) + obs.length + len(answer)
        ids, mask = batch.completion_ids[i], batch.policy_mask[i]
        assert ids[:len(call)].tolist() == call and ids[obs.start + obs.length:n].tolist() == answer
        # The loss mask: 1 on both model turns, 0 on the observation and past the end.
        assert mask[:n].tolist() == [1] * len(call) + [0] * obs.length + [1] * len(answer)
        assert int(mask[n:].sum()) == 0 and int(batch.completion_mask[i].sum()) == n
        # The crop came from the original image around the patch, under the 56 x 56 budget.
        x1, y1, x2, y2 = traj.calls[0].seen[0]["box"]
        px1, py1, px2, py2 = s.fields["patch_box"]
        assert x1 <= px1 and y1 <= py1 and x2 >= px2 and y2 >= py2
        assert obs.tensors["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_the_warm_up_on_demonstrations_changes_the_weights(trainer):
    before = {k: v.detach().clone() for k, v in trainer.policy.model.named_parameters()}
    result = sft_warmup(trainer.cfg, trainer.policy, trainer.prompts, trainer.log)
    assert result["steps"] == 2 and len(result["history"]) == 1
    assert any(not torch.equal(before[k], v) for k, v in trainer.policy.model.named_parameters())


def test_a_records_demonstration_is_built_once_and_equals_a_fresh_one(trainer):
    """With keys (dataset indices) each record's trajectory is run through the tools once; a
    batch of cached rows, repeats and a new record among them, is the uncached batch exactly."""
    feats = [trainer.prompts.features(s) for s in trainer.prompts.dataset[:4]]
    demos = Demonstrations(trainer.cfg, trainer.policy)
    runs, rollout = [], demos.loop.rollout
    demos.loop.rollout = lambda f, p: (runs.append(len(f)), rollout(f, p))[1]
    demos.demonstrate(feats[:2], [0, 1])
    keys = [1, 3, 1, 0, 2]
    got = demos.demonstrate([feats[k] for k in keys], keys)
    assert runs == [2, 2]  # records 3 and 2 new; 0 and 1 (twice) from the cache
    want = Demonstrations(trainer.cfg, trainer.policy).demonstrate([feats[k] for k in keys])
    for name in ("completion_ids", "completion_mask", "loss_mask", "sampler_logp", "truncated"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.group_ids.tolist() == [0, 1, 2, 3, 4] and got.texts == want.texts
    for a, b in zip(got.trajectories, want.trajectories):
        assert [(o.start, o.length) for o in a.observations] == \
            [(o.start, o.length) for o in b.observations]
        assert all(torch.equal(x.tensors[k], y.tensors[k]) for x, y in
                   zip(a.observations, b.observations) for k in x.tensors)
    demos.cache_size = 2  # bounded like the prompt features: the least recently used leave
    demos.demonstrate([feats[2]], [2])
    assert list(demos._rows) == [0, 2]


def test_a_last_target_that_calls_again_is_an_error(trainer):
    cfg = copy.deepcopy(trainer.cfg)
    cfg.sft.turn_targets = [CALL, CALL]  # under tools.max_turns=2: not capped, an error
    demos = Demonstrations(cfg, trainer.policy)
    demos.loop.settings = dataclasses.replace(demos.loop.settings, max_tokens=200)  # 2 crops
    with pytest.raises(ValueError, match=r"sft.turn_targets: the demonstration's turn 2 \(of 2\) "
                                         r"still called a tool"):
        demos.demonstrate([trainer.prompts.features(trainer.prompts.dataset[0])])


def test_a_demonstrated_call_the_tool_refuses_stops_the_warm_up(trainer):
    """A target whose call the tool answers with an error (here a box outside the image) is a
    broken demonstration: the warm-up would teach reading the error. It names the record."""
    cfg = copy.deepcopy(trainer.cfg)
    cfg.sft.turn_targets = ['{{"bbox_2d": [90, 90, 99, 99]}}', ANSWER]  # a 56-px frame
    demos = Demonstrations(cfg, trainer.policy)
    demos.loop.settings = dataclasses.replace(demos.loop.settings, max_tokens=400)  # the error
    sample = trainer.prompts.dataset[0]
    with pytest.raises(ValueError, match=r"demonstration called crop at turn 1, which answered "
                                         r"bad_box") as e:
        demos.demonstrate([trainer.prompts.features(sample)])
    assert (sample.source or sample.id) in str(e.value)


def test_a_demonstration_may_look_again_past_rls_turn_cap(trainer):
    """Three targets under tools.max_turns=2: a record whose second target answers ends after
    2 turns, one whose second target calls again looks twice and answers at turn 3."""
    cfg = copy.deepcopy(trainer.cfg)
    cfg.sft.turn_targets = [CALL, "{second}", ANSWER]
    samples = [copy.deepcopy(s) for s in trainer.prompts.dataset[:2]]
    samples[0].fields["second"] = "<answer>{}</answer>".format(samples[0].solution)
    samples[1].fields["second"] = '{"bbox_2d": %s}' % samples[1].fields["patch_box_resized"]
    demos = Demonstrations(cfg, trainer.policy)
    assert demos.loop.settings.max_turns > 2 == trainer.cfg.tools.max_turns
    demos.loop.settings = dataclasses.replace(demos.loop.settings, max_tokens=300)  # 2 crops
    batch = demos.demonstrate([trainer.prompts.features(s) for s in samples])
    assert not batch.truncated.any()
    assert [t.turns for t in batch.trajectories] == [2, 3]
    assert [len(t.calls) for t in batch.trajectories] == [1, 2]
    assert not any(c.error for t in batch.trajectories for c in t.calls)
    assert batch.texts[1] == f"<answer>{samples[1].solution}</answer>"


@pytest.mark.parametrize("overrides, message", [
    (["sft.turn_targets=[a, b]"], "sft.turn_targets: a demonstration trajectory needs tools"),
    (["sft.stop_metric=looked_at_mean"],
     "sft.stop_metric=looked_at_mean: no reward 'looked_at' in `rewards`"),
])
def test_turn_targets_are_checked_against_the_tools(overrides, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load("recipes/counting/config.yaml", overrides)


def test_looked_at_scores_what_the_real_crops_read(trainer):
    samples = trainer.prompts.dataset[:4]
    feats = [trainer.prompts.features(s) for s in samples]
    demos = Demonstrations(trainer.cfg, trainer.policy)
    marks = {"mark_box": [s.fields["mark_box"] for s in samples]}
    batch = demos.demonstrate(feats)  # crops of each record's patch: every mark inside
    assert looked_at(batch.texts, None, calls=call_fields(batch.trajectories), target="mark_box",
                     **marks) == [1.0] * 4
    demos.targets = ['{{"bbox_2d": [0, 0, 3, 3]}}', ANSWER]  # the top-left corner of every image
    batch = demos.demonstrate(feats)
    far = [s.fields["mark_box"][0] > 64 or s.fields["mark_box"][1] > 64 for s in samples]
    got = looked_at(batch.texts, None, calls=call_fields(batch.trajectories), target="mark_box",
                    **marks)
    assert any(far) and all(g == 0.0 for g, f in zip(got, far) if f)


def test_the_warm_up_stops_on_the_named_metric(trainer):
    rewards = [*trainer.cfg.rewards, config.RewardSpec(name="looked_at", weight=0.0,
                                                       params={"target": "mark_box"})]
    sft = dataclasses.replace(trainer.cfg.sft, steps=4, eval_every=2, stop_accuracy=0.0,
                              stop_metric="looked_at_mean")
    cfg = dataclasses.replace(trainer.cfg, sft=sft, rewards=rewards)
    result = sft_warmup(cfg, trainer.policy, trainer.prompts, trainer.log)
    # 0.0 is reached at the first check: the stop read looked_at, a share of the val records.
    assert result["steps"] == 2 and 0.0 <= result["history"][0]["val_stop"] <= 1.0
    cfg = dataclasses.replace(cfg, sft=dataclasses.replace(sft, stop_metric="found"))
    with pytest.raises(ValueError, match="sft.stop_metric 'found' is not in the warm-up's "
                                         "held-out evaluation; it has: accuracy.*looked_at_mean"):
        sft_warmup(cfg, trainer.policy, trainer.prompts, trainer.log)
