"""Run by tests/integration/test_sequence_parallel.py under torchrun (2 gloo processes): every
case computes per-token logprobs and every parameter gradient twice, once unsplit on this rank
(SP=1) and once with the sequence split over both ranks (SP=2, the gradient summed over them as
the trainer's all-reduce does), and rank 0 writes the worst differences to a JSON file.
"""
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image

from mmrl.models import get_adapter, ulysses
from mmrl.models.encoder_cache import EncoderCache
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import enable_shared_prefix, shared_prefix_logprobs
from mmrl.train.dist import DistInfo
from mmrl.train.sp import make_layout
from mmrl.types import Sample

G, WIDTH = 3, 7
LENGTHS = [7, 3, 5, 1, 6, 7]


def messages(kinds, text):
    return [{"role": "user", "content": [{"type": k} for k in kinds] + [{"type": "text", "text": text}]}]


def sine(seconds, hz):
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def frames(t, h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


# Two prompts per family; the first video is long enough that both ranks encode part of it.
MEDIA = {
    "qwen2_5_vl": [(["video"], "What moves?", dict(videos=[frames(8, 56, 84, 0)], video_fps=2.0)),
                   (["image", "video"], "Which is red?",
                    dict(images=[Image.new("RGB", (56, 56), "red")], videos=[frames(4, 56, 56, 1)],
                         video_fps=1.0))],
    "qwen2_audio": [(["audio"], "What is said?", dict(audios=[sine(1.0, 440)])),
                    (["audio", "audio"], "Which is higher?", dict(audios=[sine(2.5, 880), sine(0.5, 220)]))],
    "qwen2_5_omni": [(["audio", "video"], "What happens?",
                      dict(audios=[sine(1.0, 440)], videos=[frames(4, 56, 56, 0)], video_fps=2.0)),
                     (["image", "audio"], "Which?", dict(images=[Image.new("RGB", (56, 84), "red")],
                                                         audios=[sine(2.0, 300)]))],
}
ENCODER = {"qwen2_5_vl": "model.visual.", "qwen2_audio": "model.audio_tower.", "qwen2_5_omni": "visual."}


def build(family, **tiny):
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2, **tiny)
    pad = processor.tokenizer.pad_token_id
    prompts = [adapter.prompt_features(processor, Sample(id=f"p{i}", messages=messages(k, t)), **kw)
               for i, (k, t, kw) in enumerate(MEDIA[family])]
    rows = [p for p in prompts for _ in range(G)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 700, (len(rows), WIDTH), generator=gen)  # BPE ids: no placeholders
    mask = (torch.arange(WIDTH)[None] < torch.tensor(LENGTHS[:len(rows)])[:, None]).long()
    return model, rows, torch.where(mask.bool(), ids, torch.full_like(ids, pad)), mask, pad


def logprobs_and_grads(model, fn, mask, reduce_over=None, scale=1.0):
    model.zero_grad(set_to_none=True)
    logp = fn()
    weights = torch.linspace(0.5, 1.5, mask.shape[0])[:, None]  # rows unlike each other
    ((logp * mask * weights).sum() * scale).backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):  # FSDP2: the reduced shards, whole
            g = g.full_tensor()
        if reduce_over is not None:  # DDP's sum; a rank may hold no gradient for a tensor
            has = torch.tensor(float(g is not None))
            dist.all_reduce(has, group=reduce_over)
            if not has:
                continue
            g = torch.zeros_like(p) if g is None else g.clone()
            dist.all_reduce(g, group=reduce_over)
        if g is not None:
            grads[name] = g.detach().clone()
    return logp.detach(), grads


def compare(family, model, rows, ids, mask, pad, layout, sp, *, shared, fsdp=False):
    m = mask.float()
    if shared:
        def single():
            return shared_prefix_logprobs(model, rows, ids, mask, pad_id=pad)
    else:
        def single():
            return completion_logprobs(model, collate(rows, ids, mask, pad), ids, mask)

    def split():
        provider = ulysses.ShardedEncoder(sp, touch=fsdp)
        return ulysses.sequence_parallel_logprobs(model, rows, ids, mask, sp, shared_prefix=shared,
                                                  pad_id=pad, provider=provider)

    if fsdp:  # FSDP2 averages its reduce-scatter over the world: the trainer scales by it
        lp_1, g_1 = logprobs_and_grads(model, single, m, scale=layout.world.world)
        lp_2, g_2 = logprobs_and_grads(model, split, m, scale=layout.world.world)
        g_1 = {k: v / layout.world.world for k, v in g_1.items()}
    else:
        lp_1, g_1 = logprobs_and_grads(model, single, m)
        lp_2, g_2 = logprobs_and_grads(model, split, m, reduce_over=None if fsdp else dist.group.WORLD)
    worst = max(g_1, key=lambda k: float((g_1[k] - g_2.get(k, 0 * g_1[k])).norm() / g_1[k].norm().clamp(min=1e-20)))
    return {"logp": float(((lp_1 - lp_2).abs() * m).max()),
            "grad": float((g_1[worst] - g_2.get(worst, 0 * g_1[worst])).norm() / g_1[worst].norm().clamp(min=1e-20)),
            "worst": worst, "grads": len(g_1), "same_names": sorted(g_1) == sorted(g_2),
            "encoder_grads": sum(1 for k, v in g_2.items() if k.startswith(ENCODER[family]) and v.abs().sum() > 0)}


def zero3_case(layout, sp):
    """DeepSpeed ZeRO-3 over both ranks: partitioned weights gathered per module, gradients
    averaged over the world (the trainer scales the loss by it, so SP's parts add up)."""
    try:
        import deepspeed
        from deepspeed.utils import safe_get_full_grad
    except ImportError:
        return {"skipped": "deepspeed is not installed"}
    deepspeed.init_distributed(dist_backend="gloo")  # joins the group torchrun made
    model, rows, ids, mask, pad = build("qwen2_5_vl")
    enable_shared_prefix(model)
    ulysses.install(model, sp)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "train_batch_size": layout.world.world, "zero_force_ds_cpu_optimizer": False,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                      config=config)
    m = mask.float()
    weights = torch.linspace(0.5, 1.5, m.shape[0])[:, None]

    def run(fn, scale):
        logp = fn()
        engine.backward((logp * m * weights).sum() * scale)
        grads = {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters()}
        engine.optimizer.zero_grad(set_to_none=True)
        return logp.detach(), {n: g.clone() for n, g in grads.items() if g is not None}

    lp_1, g_1 = run(lambda: shared_prefix_logprobs(engine, rows, ids, mask, pad_id=pad), 1.0)
    lp_2, g_2 = run(lambda: ulysses.sequence_parallel_logprobs(
        engine, rows, ids, mask, sp, shared_prefix=True, pad_id=pad,
        provider=ulysses.ShardedEncoder(sp, touch=True)), float(layout.world.world))
    worst = max(g_1, key=lambda k: float((g_1[k] - g_2[k]).norm() / g_1[k].norm().clamp(min=1e-20)))
    return {"logp": float(((lp_1 - lp_2).abs() * m).max()),
            "grad": float((g_1[worst] - g_2[worst]).norm() / g_1[worst].norm().clamp(min=1e-20)),
            "worst": worst, "grads": len(g_1), "same_names": sorted(g_1) == sorted(g_2),
            "encoder_grads": sum(1 for k, v in g_2.items() if k.startswith(ENCODER["qwen2_5_vl"])
                                 and v.abs().sum() > 0)}


def cache_case(sp):
    """The frozen-encoder cache under SP, filled as Policy.begin_step fills it (through
    ShardedEncoder): each rank encodes its share of the patches, not every prompt whole, and the
    split forward served from the cache equals the uncached one-process forward."""
    model, rows, ids, mask, pad = build("qwen2_5_vl")
    ulysses.install(model, sp)
    model.model.visual.requires_grad_(False)  # model.freeze: [vision]
    cache = EncoderCache(model)
    seen = [0]

    def count(module, args, kwargs):
        seen[0] += (args[0] if args else kwargs["hidden_states"]).shape[0]
    hook = model.model.visual.register_forward_pre_hook(count, with_kwargs=True)
    cache.fill(model, rows, None, ulysses.ShardedEncoder(sp))
    hook.remove()
    whole = sum(p.tensors[k].shape[0] for p in {id(r): r for r in rows}.values()
                for k in ("pixel_values", "pixel_values_videos") if k in p.tensors)
    per_rank = [None] * sp.size
    dist.all_gather_object(per_rank, seen[0])
    m = mask.float()
    lp_1, g_1 = logprobs_and_grads(
        model, lambda: shared_prefix_logprobs(model, rows, ids, mask, pad_id=pad), m)
    lp_2, g_2 = logprobs_and_grads(model, lambda: ulysses.sequence_parallel_logprobs(
        model, rows, ids, mask, sp, shared_prefix=True, pad_id=pad,
        provider=cache.provider(rows, True, inner=ulysses.ShardedEncoder(sp))), m,
        reduce_over=dist.group.WORLD)
    worst = max(g_1, key=lambda k: float((g_1[k] - g_2[k]).norm() / g_1[k].norm().clamp(min=1e-20)))
    return {"logp": float(((lp_1 - lp_2).abs() * m).max()),
            "grad": float((g_1[worst] - g_2[worst]).norm() / g_1[worst].norm().clamp(min=1e-20)),
            "grads": len(g_1), "same_names": sorted(g_1) == sorted(g_2),
            "encoder_rows": per_rank, "whole_rows": whole, "encoded": cache.encoded,
            "served": cache.served}


def main(out_path):
    dist.init_process_group("gloo")
    info = DistInfo(dist.get_rank(), dist.get_world_size())
    layout = make_layout(info, 2)
    sp = layout.sequence
    results = {"layout": {"data_world": layout.data.world, "data_rank": layout.data.rank,
                          "sp_rank": sp.rank, "sp_size": sp.size}}
    for family in MEDIA:
        model, rows, ids, mask, pad = build(family)
        ulysses.install(model, sp)
        for shared in (False, True):
            results[f"{family}-{'shared' if shared else 'naive'}"] = compare(
                family, model, rows, ids, mask, pad, layout, sp, shared=shared)
    # One key/value head for two ranks (repeated), on the eager kernel.
    model, rows, ids, mask, pad = build("qwen2_5_vl", num_key_value_heads=1)
    model.set_attn_implementation("eager")
    ulysses.install(model, sp)
    results["kv_repeat-eager-naive"] = compare("qwen2_5_vl", model, rows, ids, mask, pad, layout, sp,
                                               shared=False)
    # The shared-prefix varlen kernel under gradient checkpointing (the all-to-alls rerun).
    model, rows, ids, mask, pad = build("qwen2_5_vl")
    model.set_attn_implementation("mmrl_prefix_varlen")
    ulysses.install(model, sp)
    model.gradient_checkpointing_enable()
    model.train()
    results["varlen-checkpointing-shared"] = compare("qwen2_5_vl", model, rows, ids, mask, pad, layout,
                                                     sp, shared=True)
    # FSDP2 over both ranks: its reduce-scatter sums every rank's disjoint part.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from mmrl.train.parallel import shard_units
    model, rows, ids, mask, pad = build("qwen2_5_vl")
    enable_shared_prefix(model)
    ulysses.install(model, sp)
    mesh = init_device_mesh("cpu", (info.world,))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    results["fsdp2-shared"] = compare("qwen2_5_vl", model, rows, ids, mask, pad, layout, sp,
                                      shared=True, fsdp=True)
    results["zero3-shared"] = zero3_case(layout, sp)
    results["cache-sharded-fill"] = cache_case(sp)
    if info.main:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
