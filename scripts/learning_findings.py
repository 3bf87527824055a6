"""What was found about the learning table's rows (docs/learning.md, "What was found on the
way"): the faults fixed on the way, each with a test, and what still holds a row back. Kept
apart from scripts/learning_table.py, which renders it under the table for the rows measured."""

# What was found about rows that did not learn at first: faults fixed (each with a test) and what
# still holds a row back. Rendered under the table for the rows measured.
FINDINGS: dict[str, str] = {
    "classification": (
        "three faults, fixed. (1) `rollout.max_new_tokens` 16 cut every three-label answer (21 "
        "tokens) before its closing tag, 36% of the records: they could never score (the trainer "
        "now warns at start with the length to set). (2) A never-closed `<answer>` block was "
        "scored as plain text, so the policy learned to spray label words into garbage for "
        "Jaccard 0.2 while held-out Jaccard fell from 0.54 to 0.16 (now no answer). (3) The "
        "warm-up lr 1e-3 was too high for the vision path: a direct probe "
        "(`scripts/probe_vision_lr.py`: plain transformers training, no mmrl code) of the tiny Qwen2.5-VL on one-shape images stayed at chance for "
        "300 steps at 1e-3, for colour and for shape; at 1e-4 colour reached 0.99, at 3e-4 shape "
        "0.82 (every row that must read its media now warms up at 3e-4). The task also allowed "
        "1-3 of 3 shapes, so listing all three scored 2/3 without looking; it now has 1-2. Now "
        "the warm-up reads the image (0.70, shuffled 0.37), but RL lowers it: Jaccard's partial "
        "credit pays an unsure policy more for naming two shapes, and after RL every held-out "
        "answer names two. At RL lr 5e-5 it stays flat (0.70 -> 0.69); with the asr fix "
        "(temperature 0.5, lr 1e-4, 400 steps) also flat (0.71 -> 0.68): at 0.5 the policy is "
        "near-deterministic (entropy 0.02 nats a token), so groups rarely differ; at 0.8 "
        "(`rollout.temperature=0.8 train.lr=1e-4 train.steps=300`) it falls to 0.45, the held-out answers collapsing onto \"triangle\" "
        "(77 of 100) while the sampled training reward rose to 0.83 at step 100. That reward was "
        "memorisation: the warm-up had drawn 530 x 32 samples from 1000 training records (17 "
        "passes), so RL's prompts were ones the policy already knew. Two fixes: 10000 training "
        "records (the warm-up now sees each about once), and RL on the exact set (`jaccard` "
        "with `threshold: 1.0`, Visual-RFT's reward; plain Jaccard stays the metric at weight "
        "0). Seed 0 at lr 1e-4: 0.67 -> 0.75 after 300 steps, 0.82 at 400, 0.78 at 600 (400 is "
        "now the row's length, chosen on seed 0); lr 2e-4 fell 0.60 -> 0.36. With the row's "
        "settings: 0.67 / 0.73 / 0.69 -> 0.82 / 0.72 / 0.83, seed 1 flat (its warm-up ran all 600 "
        "steps to 0.73) and seed 2 0.01 short. What holds it back is reading shape: the "
        "held-out errors are nearly all circle <-> square swaps (triangles are read), and the "
        "probe needs about 800 supervised steps to name one shape at 0.95; neither a wider "
        "(`--tiny vision_hidden_size=128 --tiny vision_intermediate_size=256`: 0.85 at 300 "
        "steps, 0.79 default) or deeper tower (`--tiny vision_depth=4`: 0.61), nor a vision lr "
        "of 1e-3 or 3e-3 (`--vision-lr`: 0.75, 0.72), nor 4x the pixels "
        "(`model.tiny.min_pixels=12544 model.tiny.max_pixels=12544`: warm-up 0.59 after 410 "
        "steps, then RL collapsed to 0.32) learns it faster."),
    "captioning": (
        "`max_new_tokens` 20 cut 22% of the reference captions (fixed, with the warning above). "
        "At temperature 1 the warm-up stopped at val BLEU 0.3 before sampled captions were well "
        "formed, and RL collapsed onto tagless fragments (after = shuffled = 0.18). With the asr "
        "fix (temperature 0.5, lr 1e-4, 400 steps) and the warm-up stopping at 0.5 it reads the "
        "image (0.48, shuffled 0.22) and RL holds it (0.50) but does not raise it: at 0.5 the "
        "samples' entropy is 0.2 nats a token and falls to 0.06, so groups seldom differ in the "
        "colour or shape word that decides BLEU (seed 0). At temperature 0.8 also flat, 0.48 -> "
        "0.49 (`rollout.temperature=0.8 train.lr=1e-4 train.steps=300 sft.stop_accuracy=0.5`). "
        "Not memorisation (the classification fault): on 10000 training records (`\"n_train\": "
        "10000` in `mmrl/data/anchor_tasks.py`) it stays flat, 0.27 -> 0.17 with the row's "
        "settings and 0.53 -> 0.48 with the overrides above, the sampled reward rising 0.40 -> "
        "0.65 while greedy BLEU stayed 0.48-0.52: RL sharpened the samples toward the greedy "
        "caption instead of improving it. Nor does the classification fix carry over: trained "
        "on the exact caption (`rewards=[{name: bleu, weight: 0.0}, {name: accuracy, weight: "
        "1.0, params: {mode: exact}}, {name: format, weight: 0.1, params: {think: false}}] "
        "train.lr=1e-4 train.steps=400 sft.stop_accuracy=0.5`, 10000 records) it collapses at "
        "temperature 1 (0.53 -> 0.07: the samples were never exactly right, the format reward "
        "alone drove RL) and falls at 0.7 (0.53 -> 0.38). Like classification it must tell "
        "circles from squares (see there). Open."),
    "asr": (
        "`max_new_tokens` 14 cut 2% of the transcripts (fixed). At warm-up lr 3e-4 the model reads "
        "the audio (reward 0.40, shuffled 0.08; at 1e-3 it had not), but RL at temperature 1 "
        "lowered the held-out metric (reward 0.40 -> 0.15, every greedy answer \"zero two\" by "
        "step 50). The trainer was right: its logprobs matched the sampler's to 3e-6 on every "
        "step. The samples were not: after a short warm-up the tiny model's tail over 151k "
        "tokens is fat, sampled transcripts at temperature 1 were mostly junk (\"zer\ufffdtwo\", "
        "sampled reward 0.08 while greedy scored 0.40), and RL optimised that sampled policy from "
        "0.08 while greedy fell to meet it. Ruled out on seed 0: the format reward (without it "
        "0.17), negative advantages (positive-only, 0.24), top-k 10 (0.17), top-p 0.9 (0.25), a "
        "longer warm-up (0.63 -> 0.29), lr 5e-5, KL 0.04, Dr.GRPO. At temperature 0.5 samples are "
        "greedy plus its plausible alternatives (sampled reward 0.36 at step 1) and RL raises "
        "greedy; with lr 1e-4 (2e-4 dipped) and 400 steps the row learns (learn.yaml)."),
    "detection": (
        "at warm-up lr 1e-3 (300 steps) held-out mIoU stayed at the level of guessing a cell "
        "(about 0.07), on Qwen2.5-VL and on Qwen3-VL (whose vision tower adds absolute position "
        "embeddings). At 3e-4 for 600 steps it localises the objects: mIoU 0.35 before RL, "
        "shuffled images 0.09; with 2-3 objects a scene, that is about picking one of them. RL "
        "with the `iou` reward collapsed (temperature 1, lr 2e-4, 150 steps: 0.19; 0.5 and lr "
        "1e-4: 0.06 after 400 steps) because the policy learned to hedge: a box spanning a "
        "whole row of cells "
        "([3, 33, 279, 56] on an 84-px image) scores IoU 0.07 wherever the square sits in that "
        "row, a precise box in the wrong cell scores 0, so in groups that missed, the hedge got "
        "the top advantage (+0.7 against -1.2). Dr.GRPO's unscaled advantages did not stop it "
        "(0.11; `algo.preset=dr_grpo rollout.temperature=0.5 train.lr=2e-4`). These runs trained "
        "on `rewards=[{name: iou, weight: 1.0, params: {coords: qwen2_5_vl}}, {name: format, "
        "weight: 0.1, params: {think: false}}]`. Trained on matched IoU >= 0.5 (the `detection` "
        "reward, mIoU still the metric; learn.yaml now) the collapse is gone: 0.35 -> 0.31 at "
        "temperature 0.7, 0.30 at 1.0 (`rollout.temperature=1.0`), over 300 steps; the "
        "hedge scores 0 now. RL still does not raise it: it would have to teach which object is "
        "the red square, and the rollouts show groups agreeing on one cell (zero-std groups "
        "25-60%). On 10000 training records (the warm-up's 600 x 32 draws were 19 passes over "
        "the 1000, and the sampled training reward, 0.3-0.58, ran above held-out mIoU) the warm-up "
        "ends lower and RL does not raise it either: 0.22 -> 0.27 (seed 0, 7 min); the row keeps "
        "1000. Choosing the red square over a red circle needs shape, which the tiny tower reads "
        "slowly (classification). Open."),
    "temporal_grounding": (
        "at temperature 1 the warm-up met its stop criterion (0.35) with a near-constant segment "
        "and after RL the prediction ignored the video (after = shuffled = 0.37). With the asr "
        "fix (temperature 0.5, lr 1e-4, 350 steps) and the warm-up stopping at 0.5, RL raises "
        "mIoU on every seed (0.47 / 0.64 / 0.60 -> 0.76 / 0.82 / 0.83; shuffled 0.22-0.33)."),
    "video_qa": (
        "the first task, motion direction (which way does the square move), needs both where "
        "and when; its warm-up stayed at chance (0.27) for 450 steps at 3e-4 as at 1e-3. The "
        "prompt also listed the options twice (fixed: Video-R1 keeps them apart). The task is "
        "now the issue's own example of order, which colour the square has first (both colours "
        "are in every clip, so without their order the best answer is a coin toss between two). "
        "With a 14-px square (the anchor task's `square` then) and temperature 1 the warm-up "
        "still stayed at chance (0.27 -> 0.22); with a 24-px square and no think template the "
        "warm-up reads it (0.31, and 0.41 on its own check), but at temperature 1 "
        "(`rollout.temperature=1.0 train.lr=2e-4 train.steps=150`) the samples scored 0.12 "
        "while greedy scored 0.31 (the trainer's warning fired) and RL reached 0.42. At temperature 0.5, lr 1e-4 and "
        "300 steps (the asr fix) it learns (seed 0: 0.31 -> 0.99, shuffled 0.20)."),
    "temporal_grounding+tgrpo": (
        "a null at this scale: mIoU 0.76 / 0.82 / 0.79 against plain GRPO's 0.76 / 0.82 / 0.83 "
        "(the same final greedy segments on seeds 0 and 1, by different paths: 0.58 / 0.67 vs "
        "0.69 / 0.68 half-way). The shuffled group loses nearly always (win fraction 0.95-0.97), "
        "because the row already reads the order, so the bonus lands on most rows of most groups "
        "and moves them together; it only separates samples above tIoU 0.1 from those below. "
        "Cost: the video rollouts double, wall time 290 -> 400 s a run (+36%)."),
    "video_qa+tgrpo": (
        "on the colour-order row (where order alone answers) also a null: 1.00 on every seed "
        "against plain GRPO's 0.99 / 1.00 / 0.97, because plain GRPO already solves it; the "
        "ordered group beat the shuffled one in 89% of the groups. Cost: the video rollouts "
        "double, 160 -> 192 s a run (+20%). A harder order task, where plain GRPO stalls, is "
        "what would show whether the bonus helps."),
    "counting+majority_vote": (
        "first run with `min_agreement: 0.5` (seed 0): after the 50-step warm-up, 8 samples at "
        "temperature 1 seldom agreed, so the vote scored None, the 0.1 format reward alone drove "
        "RL, the policy wrote ever more varied tokens inside well-formed tags, and accuracy fell "
        "0.46 -> 0.00 (majority wrong 0.99). With TTRL's plain majority (0.0) the policy "
        "settles on a constant answer on every seed (0.46 -> 0.26 / 0.29 / 0.29 = shuffled, "
        "majority wrong 0.76), and at rollout temperature 0.5 too (seed 0: 0.46 -> 0.20, majority "
        "wrong 0.75): at this scale the vote does not replace the label."),
    "temporal_grounding+gt_guidance": (
        "helps on every seed: mIoU 0.90 / 0.95 / 0.97 against plain GRPO's 0.76 / 0.82 / 0.83 "
        "(+0.13 to +0.14), at no extra wall time; the ground-truth segment replaced a rollout "
        "in 9% / 4% / 3% of the groups (those whose best sample scored under 0.5), mostly "
        "early in RL."),
    "counting+think_hybrid": (
        "first runs: the think share stayed 0.00 on every seed, because the warm-up imitated "
        "`<answer>N</answer>` on every prompt, so the policy never opened a `<think>` block even "
        "where asked, and the comparison was between two no-think runs. With `sft.think_target` "
        "(new: a fixed think block on the prompts asked to think) the warm-up's stop check and "
        "the held-out eval still used the bare prompts, where the model opened `<think>` and "
        "stopped: val accuracy 0.00 for all 150 warm-up steps (fixed: they now ask each prompt "
        "what training asks it). Now the policy thinks where asked (88% of those samples at the "
        "end of seed 0) and never where told not to, and matches plain GRPO. The fixed think "
        "text carries nothing, and RL wears it down to tokens like `</</</` that the format "
        "reward still accepts (non-empty): at this scale thinking neither helps nor hurts."),
    "vqa+history_skip": (
        "on the 1000-prompt vqa row the filter never fired (kept fraction 1.0, with k = 2 and "
        "k = 1): 150 steps x 8 prompts drew each prompt about once, and a history needs a second "
        "visit. The row now trains on 200 prompts (6 passes), against the same 200-prompt plain "
        "row: the filter fires, but seldom (kept fraction 0.98-0.99), because groups sampled at "
        "temperature 1 are seldom all right or all wrong (sampled accuracy 0.08-0.55 while "
        "greedy went 0.46 -> 0.75); it saves 1-2% of the rollouts and does not change the metric "
        "beyond seed noise. Found on reading the code for this: a skipped prompt was never drawn "
        "again, so once every prompt was solved a run would have had nothing left to draw; a skip "
        "now counts as the prompt's rest (drawn again next pass; tests/unit/test_methods.py)."),
    "audio_visual": (
        "built this session (Qwen2.5-Omni's thinker, a 2 s mp4 whose frames give the colour and "
        "whose soundtrack the beep count). With the old settings (temperature 1, lr 2e-4) the "
        "trainer's new warning fired at step 10: samples scored 0.00 while greedy scored 0.83 "
        "before RL; RL took greedy down to 0.29. At temperature 0.5 and lr 1e-4, with the "
        "warm-up checked every 2 steps (its val accuracy jumps from 0 to 0.78 within 10 steps "
        "once the answer format is learned), it learns on every seed (shuffled media 0.23-0.31)."),
    "counting_qwen3_vl": (
        "learns from its images (shuffled 0.17-0.26) but the warm-up overshoots its stop "
        "criterion (0.67 at its first check above 0.5) on seed 0, and RL stops at 0.75 (three "
        "counts of four right, every 2 answered 3) at 200 RL steps and at 300, while the "
        "trainer warned that samples at temperature 1 scored below greedy. At temperature 0.7 "
        "(the asr fix; the row's setting now) seed 0 reaches 1.00 by step 300, and so do seeds "
        "1 and 2."),
    "vqa+rotation_pretext": (
        "the vqa row started from the rotation row's final checkpoint (same seed) instead of the "
        "random tiny model. Its warm-up meets its stop criterion in 5-15 steps instead of 60-65 "
        "(the policy already answers with an option letter), but RL ends no higher: 0.75 / 1.00 "
        "/ 0.71 against plain GRPO's 1.00 / 0.75 / 0.95 (mean -0.08, within either row's spread "
        "over seeds). Counting the pretext run (about 100 s), it also costs more wall time. A "
        "null at this scale: turning photo-like scenes upright teaches where sky and ground are, "
        "not how many squares an image holds."),
    "temporal_jigsaw": (
        "from a folder of 2-s clips of a falling ball (`synthetic_av.paint_falling`), "
        "cut in 2 clips. Two faults, fixed. (1) The jigsaw generators drew their orders with "
        "T-GRPO's `frame_permutation`, which never returns the identity (a shuffled video must "
        "differ), so with 2 clips every answer was \"2,1\": the first run's warm-up met its "
        "stop criterion at step 10 with accuracy 1.0 on a constant answer (the jigsaws now draw "
        "any order; `clip_counting` had a like fault, its video length telling the count, and "
        "now has a fixed length). (2) At the video_qa row's stop criterion (0.4), below chance "
        "for two orders (0.51), the warm-up stopped on a constant answer and RL stayed there "
        "(0.49 -> 0.49, shuffled 0.49; a ball 14 px across at 56 px). At 0.6, with a ball two "
        "patches across (both changed at once), checked every 10 steps, held-out accuracy leapt "
        "from 0.47 to 1.00 between two checks (330 steps), leaving RL nothing to add (1.00 -> "
        "0.99; shuffled 0.51); checked every 2 steps, it stops at 0.71 and RL takes it to 1.00."),
    "clip_counting": (
        "1-3 clips of the falling-ball videos joined (each clip from another video, so a cut "
        "changes the background), how many? Seed 0 only: the warm-up reads some cuts (0.51, "
        "shuffled 0.42, chance 0.38) and RL adds 0.05 (0.56) while the sampled training reward "
        "rose to 0.85: a miss at this scale, not yet looked into (the cuts of 2 clips fall "
        "inside a 2-frame temporal patch, which may blur them)."),
}
