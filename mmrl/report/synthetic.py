"""A small fake run dir with every kind of rollout, for the report's tests and for trying
`mmrl report` without training anything:

    python -m mmrl.report.synthetic /tmp/demo_run && mmrl report /tmp/demo_run

It holds image grounding (boxes; one completion cut mid-answer), video temporal grounding
(segments), video QA, speech recognition (transcripts), a rollout whose image is missing and one
whose completion tries to inject HTML, and a tool trajectory (crop, frames, audio_clip and a
failed call, drawn turn by turn).
"""
from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# The first image rollout of every logged step predicts PRED_BOX against GT_BOX on a
# IMAGE_SIZE image; tests look for red and green pixels on those edges.
IMAGE_SIZE = (100, 80)
PRED_BOX = [10, 10, 50, 40]
GT_BOX = [60, 20, 90, 70]
INJECTION = "<script>alert('x')</script><img src=x onerror=alert(1)>"


def _image(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    im = Image.new("RGB", IMAGE_SIZE, (200, 200, 205))
    d = ImageDraw.Draw(im)
    d.rectangle([62, 22, 88, 68], fill=(40, 80, 200))  # the "object" the ground truth boxes
    for _ in range(5):
        x, y = rng.randint(0, 90), rng.randint(0, 70)
        d.ellipse([x, y, x + 8, y + 8], fill=(rng.randint(0, 255), 160, 60))
    im.save(path)


def _video(path: Path, seconds: float = 2.0, fps: int = 8, size: tuple[int, int] = (64, 48)):
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for i in range(int(seconds * fps)):
            arr = np.zeros((size[1], size[0], 3), np.uint8)
            arr[..., 0] = int(255 * i / (seconds * fps))  # red ramps up: frames differ visibly
            arr[:, : (i * size[0]) // int(seconds * fps) + 4, 2] = 220  # a growing blue bar
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _audio(path: Path, seconds: float = 1.0, sr: int = 16000) -> None:
    import soundfile as sf

    t = np.arange(int(seconds * sr)) / sr
    sweep = 0.5 * np.sin(2 * np.pi * (200 + 1800 * t / seconds) * t)  # a rising chirp
    sf.write(str(path), (sweep * np.hanning(t.size)).astype(np.float32), sr)


def _metrics(steps: int, seed: int, offset: float) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for s in range(1, steps + 1):
        p = s / steps
        acc = min(1.0, 0.25 + offset + 0.6 * p + rng.uniform(-0.05, 0.05))
        fmt_r = min(1.0, 0.5 + 0.5 * p)
        stage = {"time/rollout": 1.5 + rng.random() * 0.2, "time/scoring": 0.05,
                 "time/advantage": 0.01, "time/logprob": 0.3, "time/update": 0.8,
                 "time/sync": 0.0}
        row = {"step": s, "time": 1_700_000_000 + 3.0 * s,
               "reward/total_mean": acc + 0.5 * fmt_r, "reward/total_std": 0.3 * (1 - p) + 0.05,
               "reward/accuracy_mean": acc, "reward/accuracy_std": 0.4 * (1 - p) + 0.05,
               "reward/format_mean": fmt_r, "reward/format_std": 0.2 * (1 - p),
               "adv/mean": 0.0, "adv/std": 0.9, "adv/abs_mean": 0.7,
               "loss/loss": 0.1 * math.cos(s), "loss/clip_frac_low": 0.02 * p,
               "loss/clip_frac_high": 0.03 * p, "loss/kl": 0.001 * s,
               "loss/ratio_mean": 1.0, "loss/ratio_min": 0.8, "loss/ratio_max": 1.25,
               "entropy": 2.0 - 1.2 * p, "grad_norm": 0.5 + rng.random(), "lr": 1e-6,
               "completion/length_mean": 40 + 20 * p, "completion/length_max": 64,
               "completion/truncated_frac": 0.1 * (1 - p), "groups/zero_std_frac": 0.5 * p,
               "sampling/rounds": 1, **stage, "time/step": sum(stage.values()) + 0.1,
               "time/tokens_per_s": 900 + rng.random() * 50, "data/skipped": 0,
               # parts of time/rollout, and the speed of each phase (mmrl/train/speed.py)
               "time/rollout_prefill": 0.2, "time/rollout_decode": 1.2,
               "speed/generated_tokens_per_s": 300 + rng.random() * 20,
               "speed/decode_bytes_per_s": 1.2e9, "speed/decode_bandwidth_share": 0.25,
               "speed/update_mfu": 0.05,
               "grad_norm_clipped": None}  # a null column: must not break the plots
        if s % 10 == 0:
            row["eval/accuracy"] = acc
            row["eval/reward_mean"] = acc + 0.4
        rows.append(row)
    return rows


def _rollout(step, sid, task, group, completion, answer, solution, reward, adv, **media):
    return {"step": step, "sample_id": sid, "task": task, "group": group,
            "prompt": f"<image> Task {task}: answer inside <answer></answer>.",
            "images": media.get("images", []), "videos": media.get("videos", []),
            "audios": media.get("audios", []), "completion": completion, "answer": answer,
            "solution": solution, "fields": media.get("fields", {}),
            "rewards": {"accuracy": reward, "format": 1.0 if "<answer>" in completion else 0.0,
                        "iou": reward if task == "grounding" else None},
            "reward": reward, "advantage": adv, "length": len(completion.split()),
            "truncated": media.get("truncated", False)}


def _rollouts(root: Path, steps: list[int]) -> list[dict]:
    img, vid, wav = str(root / "media/img0.png"), str(root / "media/clip.mp4"), \
        str(root / "media/speech.wav")
    image_fields = {"image_size": list(IMAGE_SIZE), "boxes": [GT_BOX]}
    out = []
    for s in steps:
        b = PRED_BOX
        out += [
            _rollout(s, "ground-0", "grounding", 0, f"<think>left</think><answer>{b}</answer>",
                     str(b), GT_BOX, 0.0, -0.9, images=[img], fields=image_fields),
            _rollout(s, "ground-0", "grounding", 0, "<answer>[61, 21, 89, 69]</answer>",
                     "[61, 21, 89, 69]", GT_BOX, 0.93, 0.9, images=[img], fields=image_fields),
            _rollout(s, "ground-0", "grounding", 0, "<answer>[30, 30, 4", "", GT_BOX, 0.0, -0.9,
                     images=[img], fields=image_fields, truncated=True),  # cut: nothing read
            _rollout(s, "video-0", "temporal", 1, "<answer>0.5 to 1.2</answer>", "0.5 to 1.2",
                     [0.8, 1.6], 0.33, -0.5, videos=[vid], fields={"duration": 2.0}),
            _rollout(s, "video-0", "temporal", 1, "<answer>[0.7, 1.5]</answer>", "[0.7, 1.5]",
                     [0.8, 1.6], 0.78, 0.5, videos=[vid], fields={"duration": 2.0}),
            _rollout(s, "videoqa-0", "video_qa", 5, "<answer>B</answer>", "B", "B", 1.0, 0.5,
                     videos=[vid], fields={"duration": 2.0}),  # a video, no segments
            _rollout(s, "asr-0", "asr", 2, "<answer>the quick brown fox jumped</answer>",
                     "the quick brown fox jumped", "The quick brown fox jumps over", 0.5, 0.1,
                     audios=[wav]),
            _rollout(s, "missing-0", "grounding", 3, "<answer>[1, 2, 3, 4]</answer>",
                     "[1, 2, 3, 4]", [5, 5, 9, 9], 0.0, 0.0,
                     images=[str(root / "media/does_not_exist.png")]),
            _rollout(s, "inject-0", "counting", 4, INJECTION, INJECTION, "3", 0.0, -0.2,
                     truncated=True),
            _tool_rollout(s, img, vid, wav),
        ]
    return out


def _call(name: str, arguments: dict) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def _tool_rollout(step: int, img: str, vid: str, wav: str) -> dict:
    """A three-turn trajectory with a crop, a frames and an audio_clip call, and a bad span: what
    the trainer logs for it (calls[].seen as the built-in tools record them)."""
    turns = ["<think>the mark is small</think>" + _call("crop", {"bbox_2d": [56, 16, 92, 72]})
             + _call("frames", {"start": 0.5, "end": 1.5}),
             _call("audio_clip", {"start": 0.2, "end": 0.6})
             + _call("audio_clip", {"start": 0.8, "end": 1.4}),
             "<answer>blue</answer>"]
    calls = [
        {"name": "crop", "arguments": {"bbox_2d": [56, 16, 92, 72]}, "turn": 0, "error": None,
         "message": "", "seen": [{"media": "image", "path": img, "size": list(IMAGE_SIZE),
                                  "box": [56, 16, 92, 72], "returned": [72, 112]}]},
        {"name": "frames", "arguments": {"start": 0.5, "end": 1.5}, "turn": 0, "error": None,
         "message": "", "seen": [{"media": "video", "path": vid, "duration": 2.0,
                                  "span": [0.5, 1.5], "timestamps": [0.5, 0.75, 1.0, 1.25]}]},
        {"name": "audio_clip", "arguments": {"start": 0.2, "end": 0.6}, "turn": 1, "error": None,
         "message": "", "seen": [{"media": "audio", "path": wav, "duration": 1.0,
                                  "span": [0.2, 0.6]}]},
        {"name": "audio_clip", "arguments": {"start": 0.8, "end": 1.4}, "turn": 1,
         "error": "bad_span", "seen": [],
         "message": "span 0.8..1.4 s is not inside the audio (0..1 s, start < end)"},
    ]
    r = _rollout(step, "search-0", "search", 6, turns[-1], "blue", "blue", 1.0, 0.4,
                 images=[img], videos=[vid], audios=[wav])
    r.update(turns=turns, calls=calls, hit_turn_cap=False,
             observations=[{"start": 20, "length": 90, "text": ""},
                           {"start": 130, "length": 40, "text": ""}])
    return r


def write_synthetic_run(run_dir: str | Path, steps: int = 30, seed: int = 0,
                        offset: float = 0.0, rollout_steps: list[int] | None = None) -> Path:
    """Write metrics.jsonl, rollouts.jsonl, summary.json, config.yaml and media into run_dir."""
    root = Path(run_dir)
    (root / "media").mkdir(parents=True, exist_ok=True)
    _image(root / "media/img0.png", seed)
    _video(root / "media/clip.mp4")
    _audio(root / "media/speech.wav")
    metrics = _metrics(steps, seed, offset)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    rsteps = rollout_steps or [1] + list(range(10, steps + 1, 10))
    (root / "rollouts.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _rollouts(root, rsteps)))
    (root / "summary.json").write_text(json.dumps({
        "accuracy_before_rl": 0.25 + offset, "accuracy_after_rl": 0.8 + offset,
        "accuracy_shuffled_images": 0.3, "chance": 0.25, "steps": steps,
        "eval_before_rl": {"accuracy": 0.25 + offset, "n": 200},
        "phases": {"steps": steps, "seconds": {"rollout": 1.6 * steps, "update": 0.8 * steps},
                   "share": {"rollout": 0.6, "update": 0.3}, "decode_bandwidth_share": 0.25}},
        indent=2))
    (root / "config.yaml").write_text(
        f"name: {root.name}\nmodel:\n  family: qwen2_5_vl\n  path: tiny\n"
        f"rollout:\n  num_generations: 8\n  temperature: 1.0\n"
        f"rewards:\n- name: accuracy\n  weight: 1.0\n- name: format\n  weight: 0.5\n"
        f"algo:\n  advantage: grpo\n  beta: {0.04 if offset else 0.0}\n"
        f"train:\n  steps: {steps}\n  lr: 1.0e-06\n  seed: {seed}\n")
    return root


if __name__ == "__main__":
    print(write_synthetic_run(sys.argv[1] if len(sys.argv) > 1 else "demo_run"))
