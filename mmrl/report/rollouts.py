"""HTML for logged rollouts: each completion next to its media, drawn with what it predicted;
a trajectory with tools turn by turn (turns.py).

Every record string goes through `esc` and every media file is rendered inside `guarded`
(markup.py), so a missing or corrupt file becomes a visible placeholder and never aborts the
report.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mmrl.report import draw, media, parse, turns
from mmrl.report.markup import esc, fmt, guarded, img, placeholder


def _image_html(members: list[tuple[int, dict]], path: Path, rule: parse.BoxRule) -> str:
    """The group's image once: its ground-truth boxes (green) and every completion's boxes (red,
    numbered by rollout), as the box reward read them."""
    image = media.load_image(path)
    gt = parse.gold_boxes(members[0][1].get("solution"))
    pred = [(f"#{i}", box) for i, r in members for box in parse.predicted_boxes(r, rule)] \
        if gt else []
    im, _ = draw.draw_boxes(image, [b for _, b in pred], gt, labels=[n for n, _ in pred])
    if not gt:
        return img(draw.png_data_uri(im), "media-img", str(path))
    caption = f"gt {len(gt)} box(es) (green) · {len(pred)} predicted (red, by rollout #)"
    return (f'<figure>{img(draw.png_data_uri(im), "media-img drawn-boxes", str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def _plain_image_html(path: Path) -> str:
    im, _ = draw.draw_boxes(media.load_image(path), [], [])
    return img(draw.png_data_uri(im), "media-img", str(path))


def _video_html(members: list[tuple[int, dict]], path: Path) -> str:
    """The group's video once: a frame strip, and for a temporal task (its solution is a
    segment) the timeline with the ground truth and each completion's segment, one lane each."""
    frames, _, container_duration = media.video_frames(path)
    first = members[0][1]
    fields = first.get("fields") if isinstance(first.get("fields"), dict) else {}
    duration = fields.get("duration")
    if not isinstance(duration, (int, float)) or duration <= 0:
        duration = container_duration or 0.0
    strip = draw.frame_strip(frames) if frames else None
    gt = parse.gold_segment(first.get("solution"))
    if gt is None:  # not a temporal task: the frames, no timeline
        if strip is None:
            return placeholder(f"no frames decoded: {path}")
        caption = f"{float(duration):.1f}s · {len(frames)} frames"
        return (f'<figure>{img(draw.png_data_uri(draw.fit_width(strip)), "media-video", str(path))}'
                f'<figcaption>{esc(caption)}</figcaption></figure>')
    pred = [(f"#{i}", parse.pred_segment(r.get("completion") or "")) for i, r in members]
    im = draw.draw_timeline(strip, float(duration), pred, gt)
    caption = (f"{float(duration):.1f}s · gt {_segs([gt])} (green, top lane) · each rollout's "
               f"segment below it (red; none where the reward read none)")
    return (f'<figure>{img(draw.png_data_uri(im), "media-video timeline", str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def _segs(segs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{a:.2f}–{b:.2f}s" for a, b in segs) or "none"


def _audio_html(path: Path, cache: dict) -> str:
    # Same clip at every step the report shows: draw it once per report.
    key = ("audio", path)
    if key not in cache:
        samples, sr = media.load_audio(path)
        cache[key] = (draw.png_data_uri(draw.audio_picture(samples, sr)), samples.size / sr)
    uri, seconds = cache[key]
    return (f'<figure>{img(uri, "media-audio", str(path))}'
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


def group_media_html(members: list[tuple[int, dict]], roots: list[Path], cache: dict,
                     rule: parse.BoxRule) -> str:
    """A group's media, once (its completions share them), drawn with what each predicted."""
    first, parts = members[0][1], []
    for i, p in enumerate(_paths(first.get("images"))):
        # Boxes refer to the first image: grounding answers name one frame of reference.
        parts.append(guarded(p, roots, lambda path, i=i: _image_html(members, path, rule)
                              if i == 0 else _plain_image_html(path)))
    for p in _paths(first.get("videos")):
        parts.append(guarded(p, roots, lambda path: _video_html(members, path)))
    for p in _paths(first.get("audios")):
        parts.append(guarded(p, roots, lambda path: _audio_html(path, cache)))
    return "".join(parts)


def _paths(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def rollout_card(r: dict, index: int, roots: list[Path] | None = None) -> str:
    """One completion: header line, text (a trajectory's turn by turn, with its calls drawn on
    the media they read), the answer the rewards read, reward breakdown (its media are drawn once
    for the group, with this completion's prediction numbered #index)."""
    flags = ' <span class="badge">truncated</span>' if r.get("truncated") else ""
    if r.get("hit_turn_cap"):
        flags += ' <span class="badge">turn cap</span>'
    multi = turns.is_trajectory(r)
    calls = f' · {len(r.get("calls") or [])} call(s)' if multi else ""
    head = (f'#{index} · reward <b>{fmt(r.get("reward"))}</b> · advantage '
            f'{fmt(r.get("advantage"))} · {fmt(r.get("length"))} tokens{calls}{flags}')
    answer = parse.answer_text(r)
    diff = transcript_diff(r["solution"], answer) if _wants_diff(r) else ""
    body = turns.trajectory_html(r, roots or []) if multi else \
        f'<pre class="completion">{esc(r.get("completion") or "")}</pre>'
    text = (f'{body}'
            f'<table class="kv"><tr><th>answer</th><td>{esc(answer)}</td></tr>'
            f'<tr><th>solution</th><td>{esc(_show(r.get("solution")))}</td></tr></table>'
            f'{diff}{reward_table(r)}')
    return (f'<div class="rollout" data-sample="{esc(r.get("sample_id", ""))}">'
            f'<div class="rhead">{head}</div><div class="text">{text}</div></div>')


def _show(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)


def step_html(step: int, rows: list[dict], roots: list[Path], cache: dict, run_key: str,
              open_: bool, rule: parse.BoxRule = parse.BoxRule()) -> str:
    """A <details> block for one step: rollouts grouped by prompt group, the prompt and the
    media shown once per group."""
    rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), (int, float))]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "n/a"
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:  # str(): ids are whatever the dataset used, lists included (unhashable)
        groups.setdefault((str(r.get("group")), str(r.get("sample_id"))), []).append(r)
    body, index = [], 0
    for (group, sample_id), rs in groups.items():
        members = [(index + k, r) for k, r in enumerate(rs, start=1)]
        index += len(rs)
        first = rs[0]
        body.append(f'<div class="group"><div class="ghead">group {esc(group)} · sample '
                    f'{esc(sample_id)} · task {esc(first.get("task"))}</div>'
                    f'<div class="prompt">{esc(first.get("prompt") or "")}</div>'
                    f'<div class="media">{group_media_html(members, roots, cache, rule)}</div>')
        body += [rollout_card(r, i, roots) for i, r in members]
        body.append("</div>")
    return (f'<details class="step" id="{esc(run_key)}-step-{step}"{" open" if open_ else ""}>'
            f'<summary>step {step} · {len(rows)} rollouts · mean reward {mean}</summary>'
            f'{"".join(body)}</details>')
