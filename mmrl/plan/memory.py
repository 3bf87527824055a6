"""The memory model: what one training process of a run holds at its peak, predicted from the
recipe, the model's shape, the cluster and the parallel strategy (docs/memory.md).

    mmrl plan recipes/vqa/config.yaml --gpu-gib 80 --gpus 8 --strategy zero2
    predict(facts(shape), workload(cfg, facts), Cluster(80, 8, "zero2")) -> Prediction

Every term is bytes of live tensors (what `torch.cuda.max_memory_allocated` measures):
weights, gradients, optimizer state, the KL reference, and per phase of a step the working set
(rollout KV cache, micro-batch activations, logits). Activations per token of each block are
counted by autograd on the meta device (probe.py), not written by hand. What a run config asks
for (its Facts and Workload) is from_config.py.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

GIB = 2 ** 30
STRATEGIES = ("ddp", "zero2", "zero3", "fsdp2")
CONTEXT_BYTES = GIB  # CUDA context, cuBLAS workspaces: outside torch's allocator
MARGIN = 0.9  # fit only under 90% of the rest: allocator fragmentation, untracked buffers
# DeepSpeed gradient buckets (scripts/deepspeed/zero2.json: 5e8 elements, two with overlap_comm)
ZERO2_BUCKET = 5e8


@dataclass(frozen=True)
class Cluster:
    gpu_gib: float
    gpus: int = 1
    strategy: str = "ddp"
    device: str = "cuda"  # "cpu": no context, single-tensor AdamW (what CPU torch runs)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}")


@dataclass(frozen=True)
class Workload:
    """What one process runs per step (the recipe's numbers divided over the processes)."""

    prompt_tokens: int  # P, text + media placeholders
    media_tokens: int  # of P: merged vision tokens (merge^2 patches each)
    audio_frames: int  # audio encoder positions per prompt (1500 per 30-s window)
    completion: int  # C = rollout.max_new_tokens (EOS may come earlier: this is the bound)
    group: int  # G
    prompts: int  # prompts per process per step
    micro_batch: int  # rows per forward
    shared_prefix: bool = True
    checkpointing: bool = False
    reference: bool = True  # a KL reference model (beta > 0), unless LoRA serves it
    lora_r: int = 0
    # train.sequence_parallel: N processes share one data-parallel rank's rows; each samples its
    # `prompts` and holds 1/N of every training forward's sequence and media.
    sequence_parallel: int = 1
    # sdpa / eager: a boolean [rows, 1, L, L] mask (the shared layout: [1, 1, T, T] over the
    # packed groups), whole on every rank under sequence parallelism; the varlen kernels take
    # sequence lengths instead.
    dense_mask: bool = False
    # rollout.shared_prefill (HF): each prompt prefilled once, its G samples decoded from copies
    # of that cache in rounds of `rounds_of` rows per prompt (0: all G at once).
    shared_prefill: bool = False
    rounds_of: int = 0
    # A colocated vLLM engine holds this share of the GPU (rollout.vllm.gpu_memory_utilization)
    # for its own weights and KV cache; the rollout runs there, not through HF generate.
    engine_share: float = 0.0


@dataclass
class Facts:
    """The model's sizes, from a meta-device build: no memory, a few seconds."""

    params: int
    trainable: int  # = params, or the LoRA adapters' parameters
    largest: int  # elements of the largest trainable tensor (AdamW's per-tensor temporaries)
    layer_params: int  # elements of the largest text layer (a sharded unit gathered whole)
    root_params: int  # embedding + LM head (+ final norm): FSDP2's root unit
    dtype_bytes: int
    hidden: int
    vocab: int
    layers: int
    kv_per_token: int  # KV-cache bytes per token over all layers
    merge: int  # vision tokens are merge x merge patches
    audio_window: int = 0  # audio encoder positions per window (1500 = 30 s for real models)
    full_logits: bool = False  # the forward has no logits_to_keep: logits at every position
    blocks: dict = field(default_factory=dict)  # probe.BlockCost per kind
    # For the time prediction (timing.py): bytes of the weights a decode step reads
    # (speed.decode_weight_bytes) and shared_prefix.layer_flops (linear FLOPs a token, a score).
    decode_weight_bytes: int = 0
    layer_flops: tuple = (0, 0)


@functools.lru_cache(maxsize=64)  # a meta build takes ~0.5 s; the docs test asks per command
def facts(shape: str, *, dtype: torch.dtype = torch.bfloat16, lora_r: int = 0,
          lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj")) -> Facts:
    """Facts of `shape` (a mmrl.models.shapes name, optionally NAME:LAYERS); cached per
    argument set, so callers must not change the Facts they get."""
    from mmrl.models import shapes

    name, layers = shapes.parse(shape)
    model, _ = shapes.build(name, layers, device="meta", dtype=dtype)
    return model_facts(model, dtype, lora_r=lora_r, lora_targets=lora_targets,
                       language=f"{language_prefix(model)}")


def model_facts(model, dtype: torch.dtype, *, lora_r: int = 0, lora_targets=(),
                language: str = "") -> Facts:
    """Facts of a built model (meta or real; its attention setting is probed on a meta copy)."""
    from mmrl.plan import probe

    text = model.config.get_text_config()
    params = {n: p for n, p in model.named_parameters()}
    n_params = sum(p.numel() for p in {id(p): p for p in params.values()}.values())
    if lora_r:
        lora = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                and n.split(".")[-1] in lora_targets and n.startswith(language)]
        trainable = sum(lora_r * (m.in_features + m.out_features) for m in lora)
        largest = max(lora_r * max(m.in_features, m.out_features) for m in lora)
    else:
        trainable, largest = n_params, max(p.numel() for p in params.values())
    lm = probe._find(model, "language_model") or probe._find(model, "model")
    layer = max(sum(p.numel() for p in blk.parameters()) for blk in lm.layers)
    embed = lm.embed_tokens.weight
    head = getattr(model, "lm_head", None)
    root = embed.numel() + (0 if head is None or head.weight is embed else head.weight.numel())
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    b = torch.empty((), dtype=dtype).element_size()
    vision = getattr(model.config, "vision_config", None)
    audio = getattr(model.config, "audio_config", None)
    meta = model if next(model.parameters()).device.type == "meta" else _meta_copy(model)
    import inspect

    from mmrl.models.shared_prefix import layer_flops
    from mmrl.train.speed import decode_weight_bytes
    return Facts(decode_weight_bytes=decode_weight_bytes(model), layer_flops=layer_flops(model),
                 params=n_params, trainable=trainable, largest=largest, layer_params=layer,
                 root_params=root, dtype_bytes=b, hidden=text.hidden_size, vocab=text.vocab_size,
                 layers=text.num_hidden_layers,
                 kv_per_token=2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * b,
                 merge=getattr(vision, "spatial_merge_size", 1) if vision else 1,
                 audio_window=audio.max_source_positions if audio else 0,
                 full_logits="logits_to_keep" not in inspect.signature(model.forward).parameters,
                 blocks=probe.block_costs(meta, dtype))


def _meta_copy(model):
    import transformers

    with torch.device("meta"):
        return getattr(transformers, type(model).__name__)(model.config)


def language_prefix(model) -> str:
    for name, _ in model.named_modules():
        if name.endswith("language_model"):
            return name
    return "model"


@dataclass
class Prediction:
    terms: dict  # name -> bytes (static terms, and each phase's working set)
    phases: dict  # phase -> peak bytes
    cluster: Cluster
    workload: Workload

    @property
    def peak(self) -> float:
        return max(self.phases.values())

    @property
    def phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def usable(self) -> float:
        """Bytes a run may plan to allocate on one device of the cluster."""
        if self.cluster.device == "cpu":
            return self.cluster.gpu_gib * GIB
        return (self.cluster.gpu_gib * GIB - CONTEXT_BYTES) * MARGIN

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable


@dataclass(frozen=True)
class Sharding:
    """How a strategy spreads a process's memory (elements; times bytes where used)."""

    params: bool  # weights (and the KL reference) sharded over the processes
    master: bool  # DeepSpeed: fp32 master weights + Adam state, partitioned
    gathered: Callable[[Facts], float]  # weights gathered whole while they run
    grads: Callable[[Facts, float, int], float]  # gradients per process, (facts, Nt, W)
    flat_all_reduce: bool = False  # dist.all_reduce_grads: one flat copy of the gradients


SHARDING = {
    "ddp": Sharding(False, False, lambda f: 0, lambda f, nt, w: nt, flat_all_reduce=True),
    # two reduce buckets (overlap_comm) of scripts/deepspeed/zero2.json's 5e8 elements
    "zero2": Sharding(False, True, lambda f: 0,
                      lambda f, nt, w: nt / w + 2 * min(ZERO2_BUCKET, nt)),
    # the module being run gathered (the embedding is the largest) + the prefetch bucket
    "zero3": Sharding(True, True,
                      lambda f: max(f.root_params, f.layer_params) + 0.9 * f.hidden ** 2,
                      lambda f, nt, w: nt / w + 2 * f.hidden ** 2),
    # the root unit stays gathered; two layers (current + prefetch); one layer's gradient
    # unsharded while it is reduce-scattered
    "fsdp2": Sharding(True, False, lambda f: f.root_params + 2 * f.layer_params,
                      lambda f, nt, w: nt / w + f.layer_params),
}


def static_terms(f: Facts, w: Workload, c: Cluster) -> dict:
    """Weights, gradients, optimizer state and the KL reference, per process."""
    n, nt, b, world = f.params, f.trainable, f.dtype_bytes, c.gpus
    s = SHARDING[c.strategy]
    shard = world if s.params else 1
    terms = {"weights": n * b / shard}
    if s.gathered(f):
        terms["weights gathered"] = s.gathered(f) * b
    if w.reference and not w.lora_r:
        terms["KL reference"] = n * b / shard
    if w.engine_share:
        terms["vLLM engine (colocated)"] = w.engine_share * c.gpu_gib * GIB
    if s.master:  # no separate master copy when the weights are float32 already
        terms["optimizer (fp32 master, m, v)"] = (8 + (4 if b < 4 else 0)) * nt / world
    else:  # torch AdamW: m and v in the parameters' dtype
        terms["optimizer (m, v)"] = 2 * nt * b / shard
    return terms


def gradient_terms(f: Facts, w: Workload, c: Cluster) -> dict:
    """Gradient memory while the update runs, and the extra the optimizer step needs."""
    nt, b, world = f.trainable, f.dtype_bytes, c.gpus
    s = SHARDING[c.strategy]
    grads = s.grads(f, nt, world) * b
    if c.device == "cpu":  # single-tensor AdamW: one tensor's temporaries at a time
        step = f.largest * b
    elif s.master:  # foreach AdamW over the fp32 partition
        step = 4 * nt / world
    else:  # foreach AdamW: a temporary as large as the (local) parameters
        step = nt * b / (world if s.params else 1)
    if s.flat_all_reduce and world > 1:
        step = max(step, nt * b)
    return {"gradients": grads, "optimizer step temporaries": step}


def _tokens(w: Workload, rows: int) -> tuple[int, int, int]:
    """(text-model tokens, vision patches, audio frames) of one forward over `rows` rows."""
    if w.shared_prefix:  # each group's prompt once; a completion's last token dropped
        n, g = w.prompts * w.group, w.group  # the most groups a micro-batch of rows touches
        prompts = max((min(n, k + rows) - 1) // g - k // g + 1 for k in range(0, n, rows))
        return prompts * w.prompt_tokens + rows * max(1, w.completion - 1), prompts, prompts
    return rows * (w.prompt_tokens + w.completion), rows, rows


def _split(n: int, w: Workload) -> int:
    """This rank's share of `n` positions under sequence parallelism (the largest share)."""
    return -(-n // w.sequence_parallel)


def activation_terms(f: Facts, w: Workload, rows: int) -> dict:
    """Saved-for-backward bytes of one micro-batch of `rows` rows, and its logits chain. Under
    sequence parallelism a rank keeps its 1/N of the tokens and encodes 1/N of the media; its
    logits are those of the completion tokens inside its shard: completions sit at the ends of
    the packed sequence, so one rank may hold them all (min of the two); the dense attention
    mask stays whole, and the all-to-alls add one layer's send and receive buffers."""
    whole, with_image, with_audio = _tokens(w, rows)
    tokens, b = _split(whole, w), f.dtype_bytes
    counts = {"text": tokens, "vision": _split(with_image * w.media_tokens * f.merge ** 2, w),
              "audio": _split(with_audio * w.audio_frames, w)}
    out = {}
    for kind, cost in f.blocks.items():
        n = counts[kind]
        if not n:
            continue
        if w.checkpointing:  # each block's input kept, one block recomputed at a time
            out[f"{kind} activations"] = n * (cost.width * b * cost.count + cost.saved_per_token)
        else:
            out[f"{kind} activations"] = n * cost.saved_per_token * cost.count
    if w.dense_mask:
        out["attention mask"] = whole * (whole if w.shared_prefix else w.prompt_tokens + w.completion)
    if w.sequence_parallel > 1:  # one layer at a time: q, k, v and the output, sent and received
        out["all-to-all buffers"] = 2 * 4 * tokens * f.hidden * b
    kept = rows * w.completion if w.sequence_parallel == 1 else min(rows * w.completion, tokens)
    out["logits"] = kept * f.vocab * logits_bytes(w.shared_prefix, b)
    if f.full_logits:  # e.g. Qwen2-Audio: the LM head runs on every position (and its gradient)
        out["logits"] += tokens * f.vocab * 2 * b
    return out


def logits_bytes(shared_prefix: bool, b: int) -> int:
    """Peak bytes per (completion token x vocabulary entry) of the logprob + entropy head.

    The LM head runs on completion positions only (logits_to_keep). Kept for backward: float32
    logits/T and their softmax (8); at the peak also the logits (b) and, in the backward, float32
    gradient buffers. The shared layout gathers every token's logits into one [tokens, V] copy
    and works on all of them at once (20 + b); the naive layout works row by row (12 + b).
    Measured on CPU in float32: 24.1-25.4 and 16.6 (tests/plan/test_plan.py)."""
    return (20 if shared_prefix else 12) + b


def rollout_terms(f: Facts, w: Workload, shared_prefill: bool = False) -> dict:
    """HF generate: the KV cache of every row at full length; the prefill's working set (one
    layer's no-grad intermediates over every prompt token of every row: generate expands the
    prompt to G rows before prefilling it, but encodes each prompt's media once); per decoding
    step a few [rows, V] float32 tensors. With the shared prefill (models/shared_generate.py)
    each prompt is prefilled once and its cache kept, copied (and, briefly, its copy before the
    rows are repeated) for each round of `rounds_of` rows per prompt, which decodes to P + C.
    A colocated vLLM engine samples inside its own share (a static term): nothing here."""
    if w.engine_share:
        return {}
    shared = shared_prefill or w.shared_prefill
    live = min(w.rounds_of or w.group, w.group) if shared else w.group
    rows = w.prompts * live
    b, kv = f.dtype_bytes, f.kv_per_token
    cache = rows * (w.prompt_tokens + w.completion) * kv
    if shared:
        cache += 2 * w.prompts * w.prompt_tokens * kv
    out = {"KV cache": cache,
           "prefill working set": (w.prompts if shared else w.prompts * w.group) *
           w.prompt_tokens * f.blocks["text"].nograd_per_token(b),
           "sampling logits": 4 * rows * f.vocab * 4}
    media = {"vision": w.media_tokens * f.merge ** 2, "audio": w.audio_frames}
    for kind, n in media.items():
        if kind in f.blocks and n:
            out[f"{kind} prefill"] = w.prompts * n * f.blocks[kind].nograd_per_token(b)
    return out


def predict(f: Facts, w: Workload, c: Cluster, *, shared_prefill: bool = False) -> Prediction:
    static = static_terms(f, w, c)
    grads = gradient_terms(f, w, c)
    acts = activation_terms(f, w, w.micro_batch)
    roll = rollout_terms(f, w, shared_prefill)
    base = sum(static.values())
    # A no-grad logprob pass (reference / old policy): one layer's working set and the logits
    # of one micro-batch (logits, their gathered copy, float32 logits/T).
    tokens = _split(_tokens(w, w.micro_batch)[0], w)
    b = f.dtype_bytes
    logprob = tokens * f.blocks["text"].nograd_per_token(b) + \
        acts["logits"] * (8 + 2 * b) / logits_bytes(w.shared_prefix, b)
    phases = {
        "rollout": base + sum(roll.values()),
        "logprobs": base + logprob,
        "update": base + update_working_set(grads["gradients"], sum(acts.values()),
                                            acts["logits"], micro_batches(w),
                                            f.largest * f.dtype_bytes),
        "optimizer step": base + sum(grads.values()),
    }
    terms = {**static, **grads, **{f"update: {k}": v for k, v in acts.items()},
             **{f"rollout: {k}": v for k, v in roll.items()}}
    return Prediction(terms, phases, c, w)


def micro_batches(w: Workload) -> int:
    return math.ceil(w.prompts * w.group / w.micro_batch)


def update_working_set(grads: float, acts: float, logits: float, n_micro: int,
                       largest_grad: float) -> float:
    """Gradients + activations of the update. With several micro-batches the gradients of the
    first are live through the later ones, and each later backward makes every parameter's new
    gradient before adding it in (the largest, the LM head or embedding, at the logits' peak);
    with one, the logits peak comes before any parameter gradient exists, and the gradients grow
    while the activations are freed."""
    if n_micro > 1:
        return grads + acts + largest_grad
    return max(acts, grads + acts - logits)


def largest_micro_batch(f: Facts, w: Workload, c: Cluster) -> int:
    """The largest train.micro_batch_size at which the run fits (0: not even 1)."""
    return _largest(f, c, [replace(w, micro_batch=m) for m in range(1, w.prompts * w.group + 1)])


def largest_group(f: Facts, w: Workload, c: Cluster, limit: int = 1024) -> int:
    """The largest rollout.num_generations at the configured micro-batch (0: not even 1)."""
    return _largest(f, c, [replace(w, group=g, micro_batch=min(w.micro_batch, g * w.prompts))
                           for g in range(1, limit + 1)])


def _largest(f: Facts, c: Cluster, trials: list[Workload]) -> int:
    best = 0
    for i, trial in enumerate(trials, start=1):
        if not predict(f, trial, c).fits:
            break
        best = i
    return best


__all__ = ["Cluster", "Facts", "Prediction", "Workload", "activation_terms", "facts",
           "gradient_terms", "language_prefix", "largest_group", "largest_micro_batch",
           "model_facts", "predict", "rollout_terms", "static_terms"]
