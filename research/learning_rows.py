"""The learning table's rows (docs/learning.md): which recipe each trains, with which overrides,
and the methods compared with their plain-GRPO rows. Read by learning_table.py (to run them) and
learning_render.py (to lay them out)."""
from __future__ import annotations

import random

# row -> (recipe, extra overrides). The metric is the recipe's eval.metric_reward.
ROWS: dict[str, tuple[str, list[str]]] = {
    "counting": ("counting", []),
    "detection": ("detection", []),
    "temporal_grounding": ("temporal_grounding", []),
    "asr": ("asr", []),
    "vqa": ("vqa", []),
    "classification": ("classification", []),
    "video_qa": ("video_qa", []),
    "audio_qa": ("audio_qa", []),
    "captioning": ("captioning", []),
    "counting_qwen2_vl": ("counting", ["model.family=qwen2_vl"]),
    # Seed 0 (warmed up to 0.67) stopped at 0.75 (three counts of four) after 200 and after 300
    # steps at temperature 1, where the trainer warned that samples scored below greedy; at 0.7
    # (the asr fix) it reaches 1.0 by step 300.
    "counting_qwen3_vl": ("counting", ["model.family=qwen3_vl", "train.steps=300",
                                       "rollout.temperature=0.7"]),
    "audio_visual": ("audio_visual", []),  # Qwen2.5-Omni (thinker): video and audio
    # 200 training prompts: 150 steps x 8 prompts are 6 passes, so a prompt's history (which
    # spans passes) has visits to remember; the plain row for history filtering.
    "vqa_200": ("vqa", ["data.max_samples=200"]),
    # A pretext task (docs/methods.md, pretext tasks): `mmrl data generate rotation` on a
    # folder of photo-like scenes (PRETEXT), trained with the vqa recipe's accuracy reward.
    # Temperature 1: its five seeds on eval seed 101 were measured there (cut+text at most 8%),
    # before the vqa layer moved to 0.7 (issue #32).
    "rotation": ("vqa", ["rollout.temperature=1.0"]),
    # The same for videos: `mmrl data generate temporal_jigsaw` (2 clips: in order or swapped)
    # on a folder of clips of a falling ball, trained with the video_qa recipe on `order`.
    "temporal_jigsaw": ("video_qa", [
        "rewards=[{name: order, weight: 1.0}, {name: format, weight: 0.1, params: {think: false}}]",
        "eval.metric_reward=order", "rollout.max_new_tokens=12", "data.video_fps=2",
        # Two orders: at 0.4 the warm-up stopped on a constant answer. Checked every 2 steps:
        # val accuracy leaps from 0.5 to 1.0 within 10 steps once the order is read.
        "sft.stop_accuracy=0.6", "sft.eval_every=2"]),
    # `mmrl data generate clip_counting`: 1-3 clips of those videos joined, how many?
    "clip_counting": ("video_qa", [
        "rewards=[{name: count, weight: 1.0}, {name: format, weight: 0.1, params: {think: false}}]",
        "eval.metric_reward=count", "data.video_fps=2", "sft.stop_accuracy=0.6",
        "sft.eval_every=2",
        # CRUTCHES (research/README.md, round 3): 28-px frames at one visual token a temporal
        # patch (comparing patches is what tells 3 clips from 1), a KL to the warm-up and 600
        # RL steps; at 56 px and 300 steps the row met on 2 of 5 seeds.
        "model.tiny.video_min_pixels=784", "model.tiny.video_max_pixels=784", "algo.beta=0.04",
        "train.steps=600"]),
    # Issue #26 item 7: find the yellow patch in a 448-px scene seen at 56x56 and read its
    # pattern; only a crop of the patch shows it (`mmrl data generate visual_search`). The
    # no-tool control is the same data written with tools=false: no crop is offered.
    "visual_search": ("visual_search", []),
    "visual_search_no_tool": ("visual_search", [
        "tools.use=[]", "sft.turn_targets=[]", "sft.target='<answer>{solution}</answer>'",
        "rewards=[{name: accuracy, weight: 1.0, params: {mode: choice}},"
        " {name: format, weight: 0.5, params: {think: optional}}]"]),
    # Issue #26 item 7: which colour flashes on the grey card? The flash falls between the
    # frames of the 0.5-fps first look and of a look at the whole clip; `frames` over the card's
    # half shows it. The warm-up target is the record's `warmup_wide` field (WARMUP; the layer's
    # sft.turn_targets). The no-tool control: tools=false, one-turn answers.
    "video_search": ("video_search", []),
    "video_search_no_tool": ("video_search", [
        "sft.target='<answer>{solution}</answer>'", "sft.turn_targets=[]",
        "rewards=[{name: accuracy, weight: 1.0, params: {mode: choice}},"
        " {name: format, weight: 0.5, params: {think: optional}}]"]),
    # Issue #58 item 2: walk a corridor of 6 right/down moves, a new 28-px view after each move
    # (the grid_nav environment); the control withholds every view after the first.
    "grid_nav": ("grid_nav", []),
    "grid_nav_blank": ("grid_nav", ["env.args={blank: true}"]),
    # The same walks with each view after a move a 2-frame clip (the view left, then the view
    # reached: one temporal patch, one visual token at 28 px), settings otherwise grid_nav's.
    "grid_nav_video": ("grid_nav", ["env.args={view: video}"]),
    "grid_nav_video_blank": ("grid_nav", ["env.args={view: video, blank: true}"]),
}
# Rows whose records a generator writes directly (mmrl records, no anchor conversion):
# row -> (generator, arguments). The search rows' generators are research's own
# (search_variants.py: the product's writer with the layouts these rows tuned), run by the CLI
# through its "module:function" escape hatch.
SEARCH_VARIANTS = "research.search_variants:"
# visual_search: 1344-px scenes seen at 84 x 84 (9 visual tokens); the patch mid-cell of a
# 3 x 3 grid, each cell one visual token (the detection row's geometry), and 224 px: a whole
# 14-px input patch of yellow, the pattern (8 px, half an input pixel) in its middle; a crop of
# the mark shows it at ~21 px (at 672 px with a 4-px pattern, 12 px: read later than found).
# CRUTCH for time (round 8, research/README.md): a two-word question; the tiny model reads no
# English, and the sentence, options and hint were 74 of a demonstration's 212 tokens.
_SEARCH = {"n_train": 600, "n_eval": 100, "size": 1344, "patch": 224, "cell": 2,
           "budget_pixels": 7056, "grid": 3, "prompt": "Which pattern?"}
# video_search: the flash colours the whole 28-px frame; each split's cards start in either half
# as often (a look fixed on one half reads half the flashes); the hidden flash also falls between
# the 8 frames a look at the whole clip keeps (0, 1, 2, 3, 4.5, 5.5, 6.5, 7.5 s), so only a look
# at the card's half (every frame) reads it, as only a tight crop reads visual_search's mark.
_VIDEO = {"n_train": 600, "n_eval": 100, "seconds": 8, "fps": 2, "size": 28, "sample_fps": 0.5,
          "card_seconds": 3, "flash_frames": 1, "seen": 0.25, "card_at": [0, 0.5, 1, 4, 4.5, 5],
          "flash_inset": -7, "balance_card_at": True,
          "hide_from": [{"fps": 2.0, "start": 0.0, "end": 7.5, "max_frames": 8}],
          "prompt": "Which colour?"}  # CRUTCH for time (round 13), as _SEARCH's


def video_warmup(record: dict, call_format: str = "qwen") -> str:
    """The video_search warm-up's target (CRUTCH, research/README.md): SFT imitates the first
    turn only, so a record whose flash the first look misses imitates the `frames` call on the
    half of the clip that holds the card (3.5 s: its 8 frames at 2 fps, an even count, all come
    back from qwen-vl-utils' sampling), and one whose flash the first look shows imitates the
    answer: the tiny model learns to answer once the colour is in view, as it is after a call."""
    if record.get("flash_seen"):
        return f"<answer>{record['solution']}</answer>"
    half, card = _halves(record)
    return _span_call(card, half, call_format)


def _halves(record: dict) -> tuple[float, float]:
    """(half the clip's length, the start of the half that holds the card)."""
    half = record["duration"] / 2
    return half, 0 if record["card_span"][1] <= half else half


def _span_call(start: float, half: float, call_format: str = "json_span") -> str:
    """The `frames` call on the half from `start` (3.5 s of an 8 s clip: 8 frames at 2 fps)."""
    if call_format == "json_span":  # tools.call_format json_span: the bare span
        return '{"span": [%g, %g]}' % (start, start + half - 0.5)
    return ('<tool_call>{"name": "frames", "arguments": {"start": %g, "end": %g}}</tool_call>'
            % (start, start + half - 0.5))


def video_looks(record: dict) -> dict:
    """The look-again warm-up's targets (CRUTCH, research/README.md): where the first look
    shows the flash, the answer; else the span call on a half drawn from the record's id (the
    card's half or the other, even odds), and then the answer if that half held the card, or the
    other half's span call (the answer follows, the layer's third target). So every demonstration
    reads the flash out of returned frames, and the first call is a coin toss that RL's turn cap
    (a second call scores 0) turns into the half the first look points at."""
    answer = f"<answer>{record['solution']}</answer>"
    if record.get("flash_seen"):
        return {"look_first": answer, "look_second": answer}
    half, card = _halves(record)
    first = card if random.Random(record["id"]).random() < 0.5 else half - card
    return {"look_first": _span_call(first, half),
            "look_second": answer if first == card else _span_call(card, half)}


def video_mixed(record: dict, tight: float = 0.4) -> str:
    """The mixed warm-up's call (CRUTCH, research/README.md; visual_search's `warmup_box` for
    video): the span call on the card's half on a `tight` share of the hidden-flash records,
    drawn from the record's id, and on the other half (frames without the flash) on the rest;
    the answer where the first look shows the flash. Meant to leave greedy's call on the wrong
    half with samples that find the card; on its pilot (round 9, H) the warm-up settled on one
    half for every record instead."""
    if record.get("flash_seen"):
        return f"<answer>{record['solution']}</answer>"
    half, card = _halves(record)
    return _span_call(card if random.Random(record["id"]).random() < tight else half - card,
                      half)


def video_wide(record: dict, tight: float = 0.4) -> str:
    """The wide warm-up's call (CRUTCH, research/README.md, round 11; visual_search's
    `warmup_box` for video): the span call on the card's half (8 frames at 2 fps: the flash
    shows) on a `tight` share of the hidden-flash records, drawn from the record's id, and on
    the whole clip (0-7.5 s thinned to 8 frames: the one-frame flash shows on some records and
    not others; with the row's `hide_from`, round 12, on none) on the rest; the answer where the
    first look shows the flash."""
    if record.get("flash_seen"):
        return f"<answer>{record['solution']}</answer>"
    half, card = _halves(record)
    if random.Random(record["id"]).random() < tight:
        return _span_call(card, half)
    return _span_call(0, record["duration"])  # the whole clip, 0-7.5 s


# grid_nav: 6 moves, right or down, no slack (a wrong move crashes into the corridor's wall); a
# 2 x 2 window of 14-px cells (one visual token); 100 held-out walks are evaluated.
_GRID = {"n_train": 600, "n_eval": 200, "length": 6, "moves": "right_down", "window": 2,
         "cell": 14, "slack": 0, "prompt": "Move."}


def grid_walk(record: dict, tight: float = 0.4) -> dict:
    """The grid_nav warm-up's moves (CRUTCH, research/layers/grid_nav.yaml; visual_search's
    `warmup_box` for a walk): for each turn, the solution's move on a `tight` share drawn from
    the record's id, else "right" (a demonstration ends at its first crash). So the warm-up
    teaches the answer shape and a lean to "right" that greedy decoding follows whatever the
    view (before RL it succeeds only on all-right corridors), while the samples go down where
    the view shows the way down on some draws: RL makes the reading the policy."""
    rng = random.Random(f"walk {record['id']}")
    return {f"walk_{k}": move if rng.random() < tight else "right"
            for k, move in enumerate(record["moves"])}


def search_warmup(record: dict, tight: float = 0.4) -> list[int]:
    """The visual_search warm-up's box (CRUTCH, research/README.md): the record's mark (a crop
    that reads it) on a `tight` share of the training records, drawn from the record's id, and
    the whole 84 x 84 image (a look again at everything, unreadable) on the rest."""
    if random.Random(record["id"]).random() < tight:
        return record["mark_box_resized"]
    side = round(_SEARCH["budget_pixels"] ** 0.5)  # the square scenes' input frame
    return [0, 0, side, side]


# Generated rows whose training records get warm-up fields (sft.turn_targets name them):
# visual_search's `warmup_box`; video_search's call in the `<tool_call>` form (`warmup`) and in
# the json_span form (`warmup_span`), and the look-again targets (`look_first`, `look_second`).
WARMUP = {"visual_search": lambda r: {"warmup_box": search_warmup(r)},
          "grid_nav": grid_walk, "grid_nav_blank": grid_walk,
          "grid_nav_video": grid_walk, "grid_nav_video_blank": grid_walk,
          "video_search": lambda r: {"warmup": video_warmup(r),
                                     "warmup_span": video_warmup(r, "json_span"),
                                     "warmup_mixed": video_mixed(r),
                                     "warmup_wide": video_wide(r),
                                     **video_looks(r)}}
GENERATED = {"visual_search": (SEARCH_VARIANTS + "visual_search", _SEARCH),
             "visual_search_no_tool": (SEARCH_VARIANTS + "visual_search",
                                       {**_SEARCH, "tools": False}),
             # 8 s at 2 fps, 28-px frames. The 3 s card lies in one half (card_at) and holds a
             # frame of the 4 sampled (0, 2.5 s | 5, 7.5 s): the first look's two temporal
             # tokens say which half to ask for. A quarter of the training records show their
             # flash at first look (`seen`: the warm-up's answers).
             "video_search": (SEARCH_VARIANTS + "video_search", _VIDEO),
             "video_search_no_tool": (SEARCH_VARIANTS + "video_search",
                                      {**_VIDEO, "tools": False}),
             "grid_nav": ("grid_nav", _GRID), "grid_nav_blank": ("grid_nav", _GRID),
             "grid_nav_video": ("grid_nav", _GRID), "grid_nav_video_blank": ("grid_nav", _GRID)}
# Rows launched on more than one process (data-parallel through torchrun, one thread each, the
# warm-up's batches, RL's groups and the evaluations split between them). None yet: visual_search
# on 2 processes with 50 RL steps (round 6, research/README.md) missed on seed 0.
PROCESSES: dict[str, int] = {}
# Tool rows and their single-turn no-tool controls (issue #26's bar on top of the usual one:
# the tool row ends >= 0.15 above its control, which stays within 0.05 of chance).
CONTROLS = {"visual_search": "visual_search_no_tool", "video_search": "video_search_no_tool"}
# Environment rows and their no-view controls (issue #58): the same environment with every view
# after the first withheld; the control ends within 0.05 of its own before-RL value.
ENV_CONTROLS = {"grid_nav": "grid_nav_blank", "grid_nav_video": "grid_nav_video_blank"}
# Rows whose data is a pretext task built from a folder of unlabelled media, as a user runs it
# (`mmrl data generate TASK OUT source=FOLDER`), instead of the recipe's anchor task:
# row -> (folder painted as the user's media: "photos" or "videos", generator arguments).
PRETEXT = {"rotation": ("photos", {"size": 56, "n_train": 600, "n_eval": 100}),
           "temporal_jigsaw": ("videos", {"size": 56, "n_train": 1000, "n_eval": 100,
                                          "clips": 2, "frames_per_clip": 2, "fps": 2}),
           "clip_counting": ("videos", {"size": 28, "n_train": 1000, "n_eval": 100,
                                        "max_clips": 3, "frames_per_clip": 2, "fps": 2})}
# The seeds' methods (docs/methods.md), each a row on top of a recipe row and
# compared with it seed by seed: method row -> (plain GRPO row, overrides).
METHODS: dict[str, tuple[str, list[str]]] = {
    # TTRL / MM-UPT: no labels in RL. TTRL's plain majority: with min_agreement 0.5 a majority
    # seldom formed after the warm-up, the format reward alone drove RL, and accuracy fell to 0.
    "counting+majority_vote": ("counting", [
        "rewards=[{name: majority_vote, weight: 1.0, params: {min_agreement: 0.0}},"
        " {name: format, weight: 0.1, params: {think: false}}]"]),
    # One uninformative group is enough to skip (k = 1), on the 200-prompt row: with the 1000
    # prompts of the vqa row a 150-step run drew most prompts once, and the filter never fired.
    "vqa+history_skip": ("vqa_200", ["algo.history_epochs=1", "algo.history_mode=skip"]),
    # No-Thinking-CLS-RL / TON: half the prompts ask for thinking, half forbid it; the warm-up
    # imitates a (fixed) think block where asked, or the policy never opens one.
    "counting+think_hybrid": ("counting", [
        "data.think_hybrid=0.5", "rewards=[{name: count, weight: 1.0},"
        " {name: think_format, weight: 0.1}]",
        "sft.think_target='<think>I count the red squares.</think><answer>{solution}</answer>'",
        "rollout.max_new_tokens=24"]),
    "temporal_grounding+gt_guidance": ("temporal_grounding", ["algo.gt_threshold=0.5"]),
    # Video order: temporal grounding needs it (when is the square visible; its first reward,
    # tiou, is T-GRPO's accuracy), and so does video_qa's colour order.
    "temporal_grounding+tgrpo": ("temporal_grounding", ["algo.tgrpo_alpha=0.3"]),
    "video_qa+tgrpo": ("video_qa", ["algo.tgrpo_alpha=0.3"]),  # which colour comes first
    # Spatial-SSRL / SSL4RL: RL on a pretext task first, then the task. The vqa row starts from
    # the rotation row's final checkpoint of the same seed (STARTS_FROM) instead of the random
    # tiny model; both rows answer with an option letter.
    "vqa+rotation_pretext": ("vqa", []),
}
# Method rows that start from another row's final checkpoint (run first when missing).
STARTS_FROM = {"vqa+rotation_pretext": "rotation"}
# Each method's own logged rate (metrics.jsonl), averaged over the run's steps.
RATES = {"counting+majority_vote": "label_free/majority_wrong", "vqa+history_skip":
         "history/kept_frac", "counting+think_hybrid": "think/think",
         "temporal_grounding+gt_guidance": "gt_guidance/fired_frac",
         "temporal_grounding+tgrpo": "tgrpo/win_frac", "video_qa+tgrpo": "tgrpo/win_frac"}
# Method rows on counting and vqa keep temperature 1: they and the plain rows' seeds they are
# compared with (the tuning draw) were measured there, before those layers moved to 0.7.
_AT_ONE = {"counting+majority_vote", "counting+think_hybrid", "vqa+history_skip",
           "vqa+rotation_pretext"}
for _name, (_base, _extra) in METHODS.items():
    _pin = ["rollout.temperature=1.0"] if _name in _AT_ONE else []
    ROWS[_name] = (ROWS[_base][0], ROWS[_base][1] + _pin + _extra)
GROUPS = {"recipes": [r for r in ROWS if r not in METHODS], "methods": list(METHODS)}
