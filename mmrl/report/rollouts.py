"""HTML for logged rollouts: each completion next to its media, drawn with what it predicted.

Every string that came from a record goes through `esc` (completions are untrusted model output
and prompts are dataset text). Every media file is rendered inside `_guarded`, so a missing or
corrupt file becomes a visible placeholder box and never aborts the report.
"""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, Callable

from mmrl.report import draw, media
from mmrl.report.parse import boxes_from_value, parse_boxes, parse_segment, segments_from_value


def esc(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def fmt(v: Any) -> str:
    if v is None:
        return "n/a"  # None = reward not applicable to this sample (mixed-task batches)
    if isinstance(v, float):
        return f"{v:.4g}"
    return esc(v)


def _placeholder(text: str) -> str:
    return f'<div class="missing">{esc(text)}</div>'


def _img(uri: str, cls: str, alt: str) -> str:
    return f'<img class="{cls}" src="{uri}" alt="{esc(alt)}">'


def _guarded(path: str, roots: list[Path], render: Callable[[Path], str]) -> str:
    """render(resolved_path), or a placeholder naming the path and what went wrong."""
    resolved = media.resolve(path, roots)
    if resolved is None:
        return _placeholder(f"missing: {path}")
    try:
        return render(resolved)
    except media.MediaError as e:
        return _placeholder(f"{e}: {path}")
    except Exception as e:  # a report must survive any one bad file; say what happened
        return _placeholder(f"could not render {path}: {type(e).__name__}: {e}")


def answer_text(r: dict) -> str:
    """The parsed answer if the trainer stored one, else the raw completion."""
    a = r.get("answer")
    return a if isinstance(a, str) and a else str(r.get("completion") or "")


def _iou(a: list[float], b: list[float]) -> float:
    ax1, ax2 = sorted((a[0], a[2]))
    ay1, ay2 = sorted((a[1], a[3]))
    bx1, bx2 = sorted((b[0], b[2]))
    by1, by2 = sorted((b[1], b[3]))
    iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
    ih = max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def _gt_boxes(r: dict) -> list[list[float]]:
    fields = r.get("fields") if isinstance(r.get("fields"), dict) else {}
    boxes = boxes_from_value(r.get("solution")) + boxes_from_value(fields.get("boxes"))
    unique = []
    for b in boxes:  # the solution often repeats fields.boxes
        if b not in unique:
            unique.append(b)
    return unique


def _image_html(r: dict, path: Path, draw_on: bool) -> str:
    image = media.load_image(path)
    if not draw_on:
        im, _ = draw.draw_boxes(image, [], [])
        return _img(draw.png_data_uri(im), "media-img", str(path))
    fields = r.get("fields") if isinstance(r.get("fields"), dict) else {}
    size = fields.get("image_size")
    pred = draw.box_frame(parse_boxes(answer_text(r)), image.size, size)
    gt = draw.box_frame(_gt_boxes(r), image.size, size)
    im, _ = draw.draw_boxes(image, pred, gt)
    caption = f"pred {len(pred)} box(es) (red) · gt {len(gt)} (green)"
    if pred and gt:
        best = max(_iou(p, g) for p in pred for g in gt)
        caption += f" · best IoU {best:.2f}"
    cls = "media-img drawn-boxes" if (pred or gt) else "media-img"
    return (f'<figure>{_img(draw.png_data_uri(im), cls, str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def _video_html(r: dict, path: Path) -> str:
    frames, _, container_duration = media.video_frames(path)
    fields = r.get("fields") if isinstance(r.get("fields"), dict) else {}
    duration = fields.get("duration")
    if not isinstance(duration, (int, float)) or duration <= 0:
        duration = container_duration or 0.0
    pred_seg = parse_segment(answer_text(r))
    pred = [pred_seg] if pred_seg else []
    gt = segments_from_value(r.get("solution"))
    strip = draw.frame_strip(frames) if frames else None
    im = draw.draw_timeline(strip, float(duration), pred, gt)
    caption = (f"{float(duration):.1f}s · pred {_segs(pred)} (red, lower lane) · "
               f"gt {_segs(gt)} (green, upper lane)")
    return (f'<figure>{_img(draw.png_data_uri(im), "media-video", str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def _segs(segs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{a:.2f}–{b:.2f}s" for a, b in segs) or "none"


def _audio_html(path: Path, cache: dict) -> str:
    # Same clip for every completion of a group: draw it once per report.
    key = ("audio", path)
    if key not in cache:
        samples, sr = media.load_audio(path)
        cache[key] = (draw.png_data_uri(draw.audio_picture(samples, sr)), samples.size / sr)
    uri, seconds = cache[key]
    return (f'<figure>{_img(uri, "media-audio", str(path))}'
            f'<figcaption>{esc(f"{seconds:.1f}s audio: waveform + spectrogram")}</figcaption>'
            f'</figure>')


def _normalise_words(text: str) -> str:
    """Lower case without punctuation, as WER is usually scored: the diff should show the
    errors the reward counted, not capitalisation."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def transcript_diff(reference: str, hypothesis: str) -> str:
    """Word alignment (jiwer.process_words) as HTML: equal words plain, substitutions as
    <del>ref</del><ins>hyp</ins>, deletions as <del>, insertions as <ins>, plus the WER."""
    ref, hyp = _normalise_words(reference), _normalise_words(hypothesis)
    if not ref:
        return ""
    rw, hw = ref.split(), hyp.split()
    if not hw:  # jiwer refuses empty hypotheses in some versions; everything is deleted
        parts, wer = [f'<del class="d">{esc(w)}</del>' for w in rw], 1.0
    else:
        import jiwer

        out = jiwer.process_words(ref, hyp)
        parts, wer = [], out.wer
        for chunk in out.alignments[0]:
            r_words = " ".join(rw[chunk.ref_start_idx:chunk.ref_end_idx])
            h_words = " ".join(hw[chunk.hyp_start_idx:chunk.hyp_end_idx])
            if chunk.type == "equal":
                parts.append(esc(r_words))
            elif chunk.type == "substitute":
                parts.append(f'<del class="s">{esc(r_words)}</del><ins class="s">'
                             f'{esc(h_words)}</ins>')
            elif chunk.type == "delete":
                parts.append(f'<del class="d">{esc(r_words)}</del>')
            else:
                parts.append(f'<ins class="i">{esc(h_words)}</ins>')
    return (f'<div class="diff"><span class="label">transcript vs reference · WER {wer:.3f}'
            f'</span> {" ".join(parts)}</div>')


def _wants_diff(r: dict) -> bool:
    sol, task = r.get("solution"), str(r.get("task") or "").lower()
    if not r.get("audios") or not isinstance(sol, str):
        return False
    return len(sol.split()) >= 2 or any(t in task for t in ("asr", "speech", "transcri"))


def reward_table(r: dict) -> str:
    rewards = r.get("rewards") if isinstance(r.get("rewards"), dict) else {}
    names = list(rewards)
    head = "".join(f"<th>{esc(n)}</th>" for n in names) + "<th>total</th><th>advantage</th>"
    adv = r.get("advantage")
    adv_cls = "pos" if isinstance(adv, (int, float)) and adv > 0 else \
        "neg" if isinstance(adv, (int, float)) and adv < 0 else ""
    cells = "".join(f"<td>{fmt(rewards[n])}</td>" for n in names)
    cells += f'<td><b>{fmt(r.get("reward"))}</b></td><td class="{adv_cls}">{fmt(adv)}</td>'
    return f'<table class="rewards"><tr>{head}</tr><tr>{cells}</tr></table>'


def _media_html(r: dict, roots: list[Path], cache: dict) -> str:
    parts = []
    for i, p in enumerate(_paths(r.get("images"))):
        # Boxes refer to the first image: grounding answers name one frame of reference.
        parts.append(_guarded(p, roots, lambda path, i=i: _image_html(r, path, draw_on=i == 0)))
    for p in _paths(r.get("videos")):
        parts.append(_guarded(p, roots, lambda path: _video_html(r, path)))
    for p in _paths(r.get("audios")):
        parts.append(_guarded(p, roots, lambda path: _audio_html(path, cache)))
    return "".join(parts)


def _paths(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def rollout_card(r: dict, index: int, roots: list[Path], cache: dict) -> str:
    """One completion: header line, media drawn with its prediction, text, reward breakdown."""
    flags = ' <span class="badge">truncated</span>' if r.get("truncated") else ""
    head = (f'#{index} · reward <b>{fmt(r.get("reward"))}</b> · advantage '
            f'{fmt(r.get("advantage"))} · {fmt(r.get("length"))} tokens{flags}')
    diff = transcript_diff(r["solution"], answer_text(r)) if _wants_diff(r) else ""
    text = (f'<pre class="completion">{esc(r.get("completion") or "")}</pre>'
            f'<table class="kv"><tr><th>answer</th><td>{esc(answer_text(r))}</td></tr>'
            f'<tr><th>solution</th><td>{esc(_show(r.get("solution")))}</td></tr></table>'
            f'{diff}{reward_table(r)}')
    return (f'<div class="rollout" data-sample="{esc(r.get("sample_id", ""))}">'
            f'<div class="rhead">{head}</div><div class="rbody">'
            f'<div class="media">{_media_html(r, roots, cache)}</div>'
            f'<div class="text">{text}</div></div></div>')


def _show(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)


def step_html(step: int, rows: list[dict], roots: list[Path], cache: dict, run_key: str,
              open_: bool) -> str:
    """A <details> block for one step: rollouts grouped by prompt group, prompt shown once."""
    rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), (int, float))]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "n/a"
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:  # str(): ids are whatever the dataset used, lists included (unhashable)
        groups.setdefault((str(r.get("group")), str(r.get("sample_id"))), []).append(r)
    body, index = [], 0
    for (group, sample_id), members in groups.items():
        first = members[0]
        body.append(f'<div class="group"><div class="ghead">group {esc(group)} · sample '
                    f'{esc(sample_id)} · task {esc(first.get("task"))}</div>'
                    f'<div class="prompt">{esc(first.get("prompt") or "")}</div>')
        for r in members:
            index += 1
            body.append(rollout_card(r, index, roots, cache))
        body.append("</div>")
    return (f'<details class="step" id="{esc(run_key)}-step-{step}"{" open" if open_ else ""}>'
            f'<summary>step {step} · {len(rows)} rollouts · mean reward {mean}</summary>'
            f'{"".join(body)}</details>')
