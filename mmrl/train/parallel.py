"""How parameters, gradients and optimizer state are spread over processes: one strategy per run.

- `ddp` (also one process): every rank holds the whole model and optimizer; gradients are summed
  with one flat all-reduce per step (dist.all_reduce_grads), so a rank whose batch has no image
  cannot hang the others.
- `deepspeed`: ZeRO-1/2/3, optionally offloading optimizer state / parameters to CPU, through
  `deepspeed.initialize` with the JSON the accelerate config names (scripts/accelerate/zero*.yaml
  -> scripts/deepspeed/*.json) or `train.deepspeed_config`.
- `fsdp2`: torch's `fully_shard` on every decoder layer and encoder block, each encoder tower and
  the root; settings from the accelerate FSDP config (scripts/accelerate/fsdp2.yaml).

Same contract for all: the trainer's loss for a micro-batch is its part of the *global sum*
(normalised by the global token count), so `backward` undoes DeepSpeed's and FSDP's averaging
over ranks by scaling with the world size. ZeRO-3 and FSDP2 checkpoints are sharded (one file per
rank); `mmrl checkpoint consolidate` writes them out as a Hugging Face model.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

import torch

from mmrl.config import RunConfig
from mmrl.models import source
from mmrl.train import build_locks, dist, verify
from mmrl.train.optim import build_optimizer

REPO = Path(__file__).resolve().parents[2]  # scripts/deepspeed/*.json live here
STRATEGIES = ("auto", "ddp", "deepspeed", "fsdp2")
# Keys of the DeepSpeed config that the trainer owns: it accumulates micro-batches itself (one
# optimizer step per `update`), clips with train.max_grad_norm and picks precision from model.dtype.
_OWNED = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
          "gradient_clipping")


# DeepSpeed's precision section per model.dtype (float32: neither)
_DS_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def resolve(cfg: RunConfig) -> str:
    """train.parallel, with `auto` read from the launcher (accelerate launch sets these)."""
    name = cfg.train.parallel
    if name not in STRATEGIES:
        raise ValueError(f"train.parallel={name!r}: use one of {', '.join(STRATEGIES)}")
    if name in STRATEGY_CLASSES:
        return name
    return _from_launcher(cfg)  # auto


def _from_launcher(cfg: RunConfig) -> str:
    if _env_flag("ACCELERATE_USE_DEEPSPEED") or cfg.train.deepspeed_config:
        return "deepspeed"
    if _env_flag("ACCELERATE_USE_FSDP"):
        if os.environ.get("FSDP_VERSION", "1") != "2":
            raise ValueError("accelerate config uses FSDP1; mmrl shards with FSDP2: set "
                             "fsdp_config.fsdp_version: 2 (see scripts/accelerate/fsdp2.yaml)")
        return "fsdp2"
    return "ddp"


def make(cfg: RunConfig, info: dist.DistInfo) -> Strategy:
    name = resolve(cfg)
    cls = STRATEGY_CLASSES[name]
    if not cls.runs_sft and cfg.sft.steps > 0:
        raise ValueError(f"sft.steps={cfg.sft.steps}: the SFT warm-up runs with train.parallel=ddp "
                         f"only; with {name}, start from an SFT checkpoint (model.path) instead")
    strategy = cls(cfg, info)
    if strategy.shards_params and cfg.model.lora.r > 0:
        raise ValueError("model.lora with sharded parameters (ZeRO-3 / FSDP2) is not supported: "
                         "LoRA keeps the optimizer small, so use ddp or ZeRO-2 "
                         "(scripts/accelerate/zero2.yaml)")
    budget = cfg.train.max_tokens_per_micro_batch
    if getattr(strategy, "stage", 0) == 3 and budget and info.world > 1:
        # Seen on 2 processes: a rank whose longest group is text-only starts with it, another
        # with an image, and DeepSpeed stops at step 1 ("Detected a disagreement on list length").
        raise ValueError("train.max_tokens_per_micro_batch with DeepSpeed ZeRO-3 on several "
                         "processes: ZeRO-3 needs every rank's first micro-batch to run the "
                         "same modules, which a token-budget cut (longest first) does not keep "
                         "when text-only and media rows mix; use FSDP2 "
                         "(scripts/accelerate/fsdp2.yaml) or unset it to cut by rows")
    return strategy


class Strategy(Protocol):
    """What the trainer asks of a strategy. Each class below says every attribute itself; they
    share code through the module functions here, never by inheriting (DESIGN.md)."""
    name: str
    info: dist.DistInfo
    shards_params: bool  # True: each rank holds only a slice of every weight
    sharded_checkpoint: bool  # True: a checkpoint holds one shard per rank (`save_shards`)
    # True when communication is driven by per-module hooks (ZeRO-2/3 gradient buckets, FSDP2
    # gathers): every rank must then run every module, media present or not (models/towers.py).
    every_module: bool
    places_model: bool  # True: `setup` moves the model to its device(s); else the trainer does
    runs_sft: bool  # the SFT warm-up (train/sft.py) steps a plain replicated model

    def before_model(self) -> None:
        """Called before the model is built (ZeRO-3 partitions large models as they load)."""

    def setup(self, model, total_steps: int):
        """-> (module to call for training forwards, optimizer, scheduler)."""

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch's loss (its part of the global sum); `last` of the step."""

    def step(self, model, optimizer) -> float:
        """Clip and step (skipped on a NaN/inf gradient norm) -> the gradient norm."""

    def full_params(self, model):
        """Inside: every parameter whole on every rank (generation, weight sync, evaluation)."""

    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        """The whole state dict, on rank 0 (empty elsewhere); a collective for sharded ones."""

    def frozen(self, model):
        """Prepare a no-grad copy (the KL reference) the way this strategy holds weights."""

    def save_shards(self, path: Path, model, optimizer) -> None:
        """Write this rank's shard of weights and optimizer state (sharded checkpoints only)."""

    def load_shards(self, path: Path, model, optimizer) -> None:
        """Read back what `save_shards` wrote."""


def _max_norm(cfg: RunConfig) -> float:
    return cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else float("inf")


def _clip_and_step(model, optimizer, max_norm: float) -> float:
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor
    if torch.isfinite(norm):  # NaN/inf gradients: skip the update (the Learner counts it)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def _replicated_state_dict(model, info: dist.DistInfo) -> dict[str, torch.Tensor]:
    return model.state_dict() if info.main else {}


class DDP:
    """Replicated model, manual gradient all-reduce (the default; see dist.py for why)."""
    name = "ddp"
    shards_params = sharded_checkpoint = every_module = places_model = False
    runs_sft = True

    def __init__(self, cfg: RunConfig, info: dist.DistInfo):
        self.cfg, self.info = cfg, info

    def before_model(self) -> None:
        pass

    def setup(self, model, total_steps: int):
        opt, sched = build_optimizer(self.cfg.train, model, total_steps)
        return model, opt, sched

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self, model, optimizer) -> float:
        # each rank holds a part of the global sum
        dist.all_reduce_grads([p for p in model.parameters() if p.requires_grad], self.info)
        return _clip_and_step(model, optimizer, _max_norm(self.cfg))

    def full_params(self, model):
        return nullcontext()

    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        return _replicated_state_dict(model, self.info)

    def frozen(self, model):
        return model

    def save_shards(self, path: Path, model, optimizer) -> None:
        pass

    def load_shards(self, path: Path, model, optimizer) -> None:
        pass


class DeepSpeed:
    """ZeRO-1/2/3 through `deepspeed.initialize`; the stage decides what is sharded."""
    name = "deepspeed"
    places_model = True
    runs_sft = False

    def __init__(self, cfg: RunConfig, info: dist.DistInfo):
        self.cfg, self.info = cfg, info
        self.config = deepspeed_config(cfg, info.world)
        self.stage = int(self.config.get("zero_optimization", {}).get("stage", 0))
        self.shards_params = self.stage == 3
        self.every_module = self.stage >= 2
        self.sharded_checkpoint = True  # the optimizer state is partitioned from ZeRO-1 on
        self.engine = None
        self._hf_config = None

    def before_model(self) -> None:
        import deepspeed
        build_locks.check()  # before any op build: a killed one's lock would hang every rank
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend()
                                   if self.info.enabled else None)  # joins the trainer's group
        # from_pretrained then partitions a large model as it loads (zero.Init); a tiny model is
        # built whole (its weight init indexes tensors) and partitioned by deepspeed.initialize.
        if self.stage == 3 and source.parse(self.cfg.model.path).zero3_init:
            from transformers.integrations import HfDeepSpeedConfig
            self._hf_config = HfDeepSpeedConfig(self.config)  # kept alive: a weakref is read

    def setup(self, model, total_steps: int):
        import deepspeed

        offload = self.config.get("zero_optimization", {}).get("offload_optimizer", {})
        optimizer_class = torch.optim.AdamW
        if offload.get("device", "none") == "cpu":  # ZeRO-Offload steps with its CPU Adam
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            optimizer_class = DeepSpeedCPUAdam  # AdamW mode by default
        opt, sched = build_optimizer(self.cfg.train, model, total_steps, optimizer_class)
        # The scheduler acts on the client optimizer's param_groups, which ZeRO keeps using.
        text = model.config.get_text_config()  # the bucket sizes HF derives from the width
        self.config = deepspeed_config(self.cfg, self.info.world, getattr(text, "hidden_size", None))
        self.engine, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                                         config=self.config)
        return self.engine, ds_opt, sched

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        # ZeRO averages gradients over ranks; the loss is this rank's part of the global sum.
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * self.info.world, scale_wrt_gas=False)

    def step(self, model, optimizer) -> float:
        self.engine.step()  # clip (gradient_clipping), step, zero grads
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @contextmanager
    def full_params(self, model):
        if self.stage != 3 or self.engine is None:
            yield
            return
        import deepspeed
        # Gathered once, and every ZeRO-3 hook off while inside: the per-module fetches and the
        # start-of-forward trace check (a collective that DeepSpeed's own
        # unwrap_model_for_generation leaves on), since ranks run different numbers of
        # forwards when their samples stop at different lengths.
        offload = self.engine.optimizer.parameter_offload
        root_hooks = offload.module._forward_pre_hooks
        start = root_hooks.pop(offload.fwd_pre_hook.id)
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            for hook in offload.forward_hooks + offload.backward_hooks:
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                root_hooks[offload.fwd_pre_hook.id] = start
                root_hooks.move_to_end(offload.fwd_pre_hook.id, last=False)
                offload._register_deepspeed_module(offload.module)

    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        if self.stage != 3:
            return _replicated_state_dict(model, self.info)
        import deepspeed
        out = {}
        for name, p in model.named_parameters():  # one tensor at a time: bounded memory
            with deepspeed.zero.GatheredParameters([p]):
                if self.info.main:
                    out[name] = p.detach().cpu().clone()
        if self.info.main:
            out.update({k: v.cpu() for k, v in model.named_buffers()})
        return out

    def frozen(self, model):
        if self.stage != 3:
            return model
        import deepspeed
        config = {k: v for k, v in self.config.items() if k not in ("optimizer", "scheduler")}
        config["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0}
        engine, *_ = deepspeed.initialize(model=model, config=config)
        engine.eval()
        return engine

    def save_shards(self, path: Path, model, optimizer) -> None:
        self.engine.save_checkpoint(str(path / "deepspeed"), tag="shards",
                                    save_latest=False)

    def load_shards(self, path: Path, model, optimizer) -> None:
        # The checkpoint verified (rank 0, rundir.prepare); the engine asks for full pickle
        # loads anyway, so they run as weights_only (verify.only_weights).
        with verify.only_weights():
            self.engine.load_checkpoint(str(path / "deepspeed"), tag="shards",
                                        load_optimizer_states=True,
                                        load_lr_scheduler_states=False)


def deepspeed_config(cfg: RunConfig, world: int, hidden_size: int | None = None) -> dict:
    """The DeepSpeed JSON (train.deepspeed_config, else the one the accelerate config names,
    else ZeRO at the stage accelerate passes) with the keys the trainer owns filled in, and with
    the model's width (`hidden_size`) the size keys set to "auto" as transformers fills them."""
    path = cfg.train.deepspeed_config or os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if path:
        found = [p for p in (Path(path), REPO / path) if p.is_file()]
        if not found:
            raise FileNotFoundError(f"DeepSpeed config {path} not found (a relative path is read "
                                    f"from the launch directory, then from {REPO})")
        config = json.loads(found[0].read_text())
    else:
        zero = {"stage": int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))}
        for part in ("optimizer", "param"):
            device = os.environ.get(f"ACCELERATE_DEEPSPEED_OFFLOAD_{part.upper()}_DEVICE", "none")
            if device != "none":
                zero[f"offload_{part}"] = {"device": device}
        config = {"zero_optimization": zero}
    tc, mb = cfg.train, max(1, cfg.train.micro_batch_size)
    owned = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1,
             "train_batch_size": mb * world, "gradient_clipping": max(0.0, tc.max_grad_norm)}
    for key in _OWNED:
        if config.get(key, "auto") not in ("auto", owned[key]):
            raise ValueError(f"DeepSpeed config {path}: {key}={config[key]} is set by mmrl "
                             f"({owned[key]} here, from train.micro_batch_size / "
                             f"train.max_grad_norm); write \"auto\"")
        config[key] = owned[key]
    precision = _DS_PRECISION.get(cfg.model.dtype)
    for key in ("bf16", "fp16"):
        section = config.setdefault(key, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = key == precision
    config.setdefault("zero_force_ds_cpu_optimizer", False)
    zero = config.get("zero_optimization", {})
    if hidden_size:  # ZeRO-3 keeps weights under 10 x width whole on every rank
        sizes = {"reduce_bucket_size": hidden_size ** 2,
                 "stage3_prefetch_bucket_size": int(0.9 * hidden_size ** 2),
                 "stage3_param_persistence_threshold": 10 * hidden_size}
        zero.update({k: v for k, v in sizes.items() if zero.get(k) == "auto"})
    _fill_auto(config)
    return config


def _fill_auto(config: dict) -> None:
    """Remaining "auto" values (bucket sizes etc.): drop them so DeepSpeed's defaults apply."""
    for key in [k for k, v in config.items() if v == "auto"]:
        del config[key]
    for value in config.values():
        if isinstance(value, dict):
            _fill_auto(value)


class FSDP2:
    """torch's fully_shard per decoder layer, encoder block and tower (shard_units) and the root."""
    name = "fsdp2"
    places_model = shards_params = every_module = sharded_checkpoint = True
    runs_sft = False

    def __init__(self, cfg: RunConfig, info: dist.DistInfo):
        self.cfg, self.info = cfg, info
        self.reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() in (
            "1", "true", "yes")
        self.offload = _env_flag("FSDP_OFFLOAD_PARAMS")
        self.units: list = []

    def before_model(self) -> None:
        pass

    def setup(self, model, total_steps: int):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        device = "cuda" if torch.cuda.is_available() else "cpu"
        mesh = init_device_mesh(device, (self.info.world,))
        kw = {"mesh": mesh, "reshard_after_forward": self.reshard,
              "offload_policy": CPUOffloadPolicy() if self.offload else OffloadPolicy()}
        for module in shard_units(model):
            fully_shard(module, **kw)
        fully_shard(model, **kw)
        # FSDP2 picks its root at the first forward; `full_params` may unshard units before any
        # forward, so fix the root now (else a unit unsharded first would claim it).
        model._get_fsdp_state()._lazy_init()
        self.units = [m for m in model.modules() if hasattr(m, "unshard")]
        # The optimizer is built on the sharded (DTensor) parameters.
        opt, sched = build_optimizer(self.cfg.train, model, total_steps)
        return model, opt, sched

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        (loss * self.info.world).backward()  # FSDP averages the reduce-scatter over ranks

    def step(self, model, optimizer) -> float:
        return _clip_and_step(model, optimizer, _max_norm(self.cfg))

    @contextmanager
    def full_params(self, model):
        for unit in self.units:  # gather every unit once and keep it so across forwards
            unit.unshard()
            unit.set_reshard_after_forward(False)
        try:
            yield
        finally:
            for unit in self.units:
                unit.reshard()
                unit.set_reshard_after_forward(self.reshard)

    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                    cpu_offload=True))

    def frozen(self, model):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (self.info.world,))
        for module in shard_units(model):
            fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def save_shards(self, path: Path, model, optimizer) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path / "dcp"))

    def load_shards(self, path: Path, model, optimizer) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
        with verify.only_weights():  # DCP's planner torch.loads its non-tensor items in full
            dcp.load(state, storage_reader=verify.safe_dcp_reader(path / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])


def shard_units(model) -> list[torch.nn.Module]:
    """Modules to shard as units, innermost first: the model's `_no_split_modules` (decoder
    layers, vision/audio blocks), then every encoder tower, so a tower can run on its own."""
    inner = getattr(model, "model", model)
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    towers = [getattr(inner, t) for t in ("visual", "audio_tower", "vision_tower")
              if isinstance(getattr(inner, t, None), torch.nn.Module)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no _no_split_modules to shard with FSDP2")
    return blocks + towers


# The strategy class per concrete train.parallel value (auto resolves to one of them).
STRATEGY_CLASSES = {"ddp": DDP, "deepspeed": DeepSpeed, "fsdp2": FSDP2}
