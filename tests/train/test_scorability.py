"""Rewards that can score nothing are said before and during training (issue 11)."""
import json

import pytest
from PIL import Image

from mmrl import cli, config
from mmrl.config import RewardSpec
from mmrl.data.inspect import check_scorable, reward_scorability
from mmrl.data.schema import load_samples
from mmrl.train.scoring import RewardSet
from mmrl.train.watch import SILENT_STEPS, SilentRewards
from mmrl.types import Sample


def _rec_file(tmp_path, n=3, with_size=False):
    Image.new("RGB", (64, 48)).save(tmp_path / "a.png")
    rows = []
    for i in range(n):
        r = {"id": i, "task": "detection", "prompt": "Where?", "images": ["a.png"],
             "solution": [1, 2, 30, 40]}
        if with_size:
            r["image_size"] = [64, 48]
        rows.append(r)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_scorability_counts_and_names_the_missing_field(tmp_path):
    samples = load_samples(_rec_file(tmp_path))
    specs = [RewardSpec(name="iou", params={"coords": "qwen2_5_vl"}), RewardSpec(name="format"),
             RewardSpec(name="tiou", tasks=["temporal_grounding"])]
    rows = reward_scorability(specs, samples)
    assert rows == [{"reward": "iou", "scorable": 0, "of": 3, "reason": "no image_size"},
                    {"reward": "format", "scorable": 3, "of": 3, "reason": ""},
                    {"reward": "tiou", "scorable": 0, "of": 0, "reason": ""}]
    with pytest.raises(ValueError, match=r"iou: 0 of 3 records scorable \(no image_size\)"):
        check_scorable(specs, samples)
    check_scorable(specs[1:], samples)  # format scores all; tiou has no records: no stop


def test_inspect_with_config_reports_rewards(tmp_path, capsys):
    data = _rec_file(tmp_path, with_size=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {train: %s}\nrewards:\n  - {name: iou, params: {coords: qwen2_5_vl}}\n"
                   % data)
    assert cli.main(["data", "inspect", str(data), "--config", str(cfg)]) == 1
    assert "iou: 0 of 3 records scorable (no image_size)" in capsys.readouterr().out
    data = _rec_file(tmp_path, with_size=True)
    assert cli.main(["data", "inspect", str(data), "--config", str(cfg)]) == 0
    assert "iou: 3 of 3 records scorable" in capsys.readouterr().out


def test_scored_frac_per_step_and_a_warning_after_silent_steps():
    rs = RewardSet([RewardSpec(name="tiou_v2", tasks=["tg"]), RewardSpec(name="format")])
    samples = [Sample(id="a", messages=[], solution=[0, 1], task="tg"),
               Sample(id="b", messages=[], solution="x", task="other")]
    warnings, watch = [], SilentRewards()
    for step in range(SILENT_STEPS):
        rs.score(samples, ["<answer>0 to 1</answer>"] * 2)  # no duration: tiou_v2 is None
        m = rs.step_metrics()
        assert m == {"reward/tiou_v2/scored_frac": 0.0, "reward/format/scored_frac": 1.0}
        watch(m, warnings.append)
        assert len(warnings) == (1 if step == SILENT_STEPS - 1 else 0)
    assert "'tiou_v2' scored none of its samples for 10 steps" in warnings[0]
    samples[0].fields["duration"] = 5.0
    rs.score(samples, ["<answer>0 to 1</answer>"] * 2)
    assert rs.step_metrics()["reward/tiou_v2/scored_frac"] == 1.0


def test_mmrl_train_stops_before_building_the_model(tmp_path, capsys):
    data = _rec_file(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{train: {data}}}\nrewards:\n  - {{name: iou, params: {{coords: "
                   f"qwen2_5_vl}}}}\nlog: {{run_dir: {tmp_path / 'run'}}}\n")
    assert cli.main(["train", str(cfg)]) != 0
    assert "iou: 0 of 3 records scorable (no image_size)" in capsys.readouterr().err


def test_answer_budget_names_gold_answers_the_rollout_budget_cuts():
    # The classification learning row once ran with max_new_tokens 16: every 3-label gold answer
    # ("<answer>circle, square, triangle</answer>" + eos = 21 tiny-tokenizer tokens) was cut
    # before its closing tag, so those records never scored and RL drifted to 1-2 labels.
    from mmrl.data.inspect import answer_budget, format_answer_budget
    from mmrl.models.tiny_tokenizer import tiny_tokenizer

    tok = tiny_tokenizer()
    samples = [Sample(id=str(i), messages=[], solution=s, task="vqa")
               for i, s in enumerate(["circle", "circle, square", "circle, square, triangle"])]
    target = "<answer>{solution}</answer>"
    longest = len(tok(target.format(solution="circle, square, triangle"),
                      add_special_tokens=False)["input_ids"]) + 1
    assert longest == 21
    cut = answer_budget(samples, tok, target, 16)
    assert cut == {"over": 1, "of": 3, "longest": 21}
    assert "raise rollout.max_new_tokens to at least 21" in format_answer_budget(cut, 16)
    assert answer_budget(samples, tok, target, 21) is None
    # As the run's start warns: for single-turn and tools runs; a stateful environment's
    # solution is spread over its turns (grid_nav's walk), so it has no one-turn budget.
    from mmrl import config
    from mmrl.data.inspect import answer_budget_warning

    base = ["data.train=x", "rollout.max_new_tokens=16"]
    for extra, warned in [([], True), (["tools.use=[{name: crop}]"], True),
                          (["env.name=grid_nav"], False)]:
        said = answer_budget_warning(config.load(None, base + extra), samples, tok)
        assert (said is not None and "at least 21" in said) == warned, extra


# ---------------------------------------------- sampled rollouts far below greedy decoding -----
def _gap(greedy, per_step, **kw):
    from mmrl.train.watch import SampledVsGreedy

    said = []
    g = SampledVsGreedy("wer", greedy, 1.0, said.append, **kw)
    for v in per_step:
        g.observe({"reward/wer_mean": v, "reward/total_mean": 0.9})
    return said


def test_sampled_far_below_greedy_warns_once_with_both_numbers():
    # the asr row at temperature 1: greedy 0.40 before RL, samples about 0.08, and staying there
    said = _gap(0.40, [0.05, 0.11] * 5 + [0.0] * 10 + [0.02] * 10 + [0.0] * 20)
    assert len(said) == 1
    assert "score 0.08 on wer over the first 10 steps and 0.02 over steps 21-30" in said[0]
    assert "scored 0.40 before RL" in said[0] and "rollout.temperature (e.g. 0.5)" in said[0]


@pytest.mark.parametrize("greedy, sampled", [
    (0.40, 0.36),          # temperature 0.5: samples near greedy
    (0.20, 0.08),          # under half, but the gap is under 0.15
    (0.40, 0.22),          # 0.18 lower, but more than half of greedy
    (None, 0.0), (float("nan"), 0.0),  # no eval before RL, or a resumed run
])
def test_sampled_near_greedy_or_no_greedy_says_nothing(greedy, sampled):
    assert _gap(greedy, [sampled] * 30) == []


def test_samples_that_start_low_and_catch_up_say_nothing():
    # The quickstart at temperature 0.5, seed 1: greedy 0.70 before RL; the samples' means over
    # steps 1-10, 11-20, 21-30 were 0.29, 0.40, 0.53, and greedy ended at 1.00.
    assert _gap(0.70, [0.29] * 10 + [0.40] * 10 + [0.53] * 10) == []
    said = _gap(0.70, [0.29] * 10 + [0.40] * 10 + [0.30] * 10, steps=10)
    assert len(said) == 1 and "over steps 21-30" in said[0]


def test_sampled_vs_greedy_waits_for_its_steps_and_ignores_other_rewards():
    assert _gap(0.9, [0.0] * 29) == []
    assert _gap(0.9, [0.0] * 30, steps=10) != []
    from mmrl.train.watch import SampledVsGreedy
    said = []
    g = SampledVsGreedy("count", 0.9, 1.0, said.append)
    for _ in range(20):
        g.observe({"reward/wer_mean": 0.0})  # the metric reward is not trained on: no numbers
    assert said == []
