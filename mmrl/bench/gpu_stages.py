"""The stages of the GPU check (gpu_check.py): each takes the sizes of its mode (real widths on
CUDA, tiny ones with --cpu) and returns plain numbers; gpu_check.py writes them as markdown.

Prompts are built by the family's real processor from random images and videos of the size
that gives the wanted token count; completions are random token ids of fixed length (EOS never
ends them early), so every layout and trial does the same work.
"""
from __future__ import annotations

import copy
import statistics
import time

import numpy as np
import torch

from mmrl.bench.common import prompt_of_length, random_completions
from mmrl.models.codec import Codec
from mmrl.types import PromptFeatures, Sample


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, trials: int, warmup: int = 1) -> tuple[float, float]:
    """(median seconds, peak bytes allocated above the start on CUDA, else 0) of fn()."""
    for _ in range(warmup):
        fn()
    times, peak = [], 0
    for _ in range(trials):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
        if torch.cuda.is_available():
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
    return statistics.median(times), peak


def video_prompt(codec: Codec, tokens: int, seed: int = 0) -> PromptFeatures:
    """A question about one video of about `tokens` vision tokens: frames of 16x16 merged tokens
    (448 px at 28 px a token), two frames per temporal token."""
    factor = codec.image_factor
    side = 16
    groups = max(1, tokens // (side * side))
    frames = np.random.RandomState(seed).randint(
        0, 255, (2 * groups, side * factor, side * factor, 3)).astype(np.uint8)
    sample = Sample(id=f"video-{tokens}", messages=[{"role": "user", "content": [
        {"type": "video"}, {"type": "text", "text": "What happens in the video?"}]}])
    return codec.prompt_features(sample, videos=[frames], video_fps=2.0)


def make_prompt(codec: Codec, kind: str, tokens: int) -> PromptFeatures:
    if kind == "video":
        return video_prompt(codec, tokens)
    return prompt_of_length(codec, tokens)


def vision_tokens(p: PromptFeatures) -> int:
    types = p.tensors.get("mm_token_type_ids")
    return int((types > 0).sum()) if types is not None else 0


# ----------------------------------------------------------------------------- FLOPs ----------

def matmul_params(model) -> dict[str, int]:
    """Weights every token multiplies with, per part: text layers, LM head, vision tower."""
    out = {"text": 0, "head": 0, "vision": 0}
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.Linear, torch.nn.Conv3d)):
            continue
        n = module.weight.numel()
        if name.endswith("lm_head"):
            out["head"] += n
        elif "visual" in name:
            out["vision"] += n
        elif "layers" in name:
            out["text"] += n
    return out


def forward_flops(model, layout: str, prompt: int, patches: int, group: int,
                  completion: int) -> float:
    """Model FLOPs of one forward over a group in `layout` (the tokens that layout runs): 2 per
    weight per token for every matmul, plus causal text attention (QK and AV). Vision
    attention is not counted (windowed, a few percent of the tower)."""
    params, text = matmul_params(model), model.config.get_text_config()
    width = text.num_attention_heads * (getattr(text, "head_dim", None)
                                        or text.hidden_size // text.num_attention_heads)
    if layout == "naive":
        tokens, images = group * (prompt + completion), group * patches
        pairs = group * (prompt + completion) ** 2 / 2
    else:
        tokens, images = prompt + group * completion, patches
        pairs = prompt ** 2 / 2 + group * (completion * prompt + completion ** 2 / 2)
    return (2 * params["text"] * tokens + 2 * params["head"] * group * completion
            + 2 * params["vision"] * images + 4 * text.num_hidden_layers * width * pairs)


# ----------------------------------------------------------------------------- stages ---------

def correctness(bundle, *, prompt_tokens: int, group: int, completion: int, kernels) -> dict:
    """Per kernel: the shared-prefix layout's and the naive layout's errors against a float32
    naive reference (logprobs: max abs; gradients: worst relative error over tensors)."""
    codec, model = bundle
    pad = codec.pad_id
    prompt = make_prompt(codec, "image", prompt_tokens)
    prompts = [prompt] * group
    ids, mask = random_completions(group, completion, pad, seed=1)
    weights = torch.randn(group, completion, generator=torch.Generator().manual_seed(2))
    reference = copy.deepcopy(model).float()
    ref_logp, ref_grads = _logp_and_grads(reference, "naive", prompts, ids, mask, weights, pad)
    del reference
    rows = {}
    for kernel in kernels:
        row = {}
        for layout in ("naive", "shared"):
            impl = model.config._attn_implementation
            try:
                model.set_attn_implementation(kernel)
                logp, grads = _logp_and_grads(model, layout, prompts, ids, mask, weights, pad)
            finally:
                model.set_attn_implementation(impl)
            m = mask.bool()
            row[f"{layout}_logp"] = float((logp - ref_logp)[m].abs().max())
            row[f"{layout}_grad"] = max(
                float((g - ref_grads[k]).norm() / ref_grads[k].norm().clamp(min=1e-30))
                for k, g in grads.items())
        row["ok"] = (row["shared_logp"] <= 2 * row["naive_logp"] + 1e-4
                     and row["shared_grad"] <= 2 * row["naive_grad"] + 1e-4)
        rows[kernel] = row
    return {"prompt_tokens": prompt.input_ids.shape[0], "group": group, "completion": completion,
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "kernels": rows}


def _logp_and_grads(model, layout, prompts, ids, mask, weights, pad):
    from mmrl.bench.update import layout_forward

    model.zero_grad(set_to_none=True)
    model.train()
    logp, width = layout_forward(layout, model, prompts, ids, mask, list(range(len(prompts))),
                                 pad_id=pad)
    loss = (logp.float() * (weights[:, :width] * mask[:, :width]).to(logp.device)).sum()
    loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.eval()
    full = torch.zeros(ids.shape)
    full[:, :width] = logp.detach().float().cpu()
    return full, grads


def update_phase(bundle, *, cells, completion: int, micro_batch: int, trials: int,
                 layouts=("naive", "shared", "varlen"), log=print) -> list[dict]:
    """Per cell (kind, P, G): each layout's seconds, tokens/s (the naive layout's token count
    over the time: work done), MFU on the FLOPs that layout runs, peak memory."""
    from mmrl.bench.update import update_phase as run_update

    codec, model = bundle
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    pad = codec.pad_id
    rows = []
    for kind, prompt_tokens, group in cells:
        prompt = make_prompt(codec, kind, prompt_tokens)
        p_len, patches = prompt.input_ids.shape[0], vision_tokens(prompt) * 4
        ids, mask = random_completions(group, completion, pad, seed=0)
        adv = torch.randn(group, generator=torch.Generator().manual_seed(1))
        row = {"kind": kind, "prompt_tokens": p_len, "group": group, "completion": completion}
        for layout in layouts:
            try:
                seconds, peak = timed(lambda: run_update(layout, model, ref, [prompt] * group, ids,
                                                          mask, adv, pad_id=pad,
                                                          micro_batch=micro_batch), trials)
            except torch.OutOfMemoryError as e:
                row[layout] = {"failure": f"out of memory ({str(e).splitlines()[0][:120]})"}
                torch.cuda.empty_cache()
                continue
            flops = 5 * forward_flops(model, layout, p_len, patches, group, completion)
            row[layout] = {"seconds": seconds, "peak_bytes": peak, "flops": flops,
                           "tokens_per_s": group * (p_len + completion) / seconds}
        rows.append(row)
        log(f"  update {kind} P={p_len} G={group}: " + ", ".join(
            f"{k} {v['seconds']:.2f} s" for k, v in row.items()
            if isinstance(v, dict) and "seconds" in v))
    return rows


def generation(bundle, *, prompt_tokens: int, group: int, completion: int, trials: int) -> dict:
    """HF generate (G prefills) vs prefill once: seconds and new tokens per second."""
    from mmrl.bench.rollout import MODES, _generate

    codec, model = bundle
    prompts = [make_prompt(codec, "image", prompt_tokens)]
    suppress = codec.placeholder_ids
    out = {"prompt_tokens": prompts[0].input_ids.shape[0], "group": group,
           "completion": completion}
    for mode in MODES[:2]:
        seconds, peak = timed(lambda: _generate(mode, model, codec.processor, prompts, group=group,
                                                completion_tokens=completion, rounds_of=group,
                                                suppress=suppress), trials)
        out[mode] = {"seconds": seconds, "tokens_per_s": group * completion / seconds,
                     "peak_bytes": peak}
    return out
