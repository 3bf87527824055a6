"""The policy: the model being trained and how it runs -- never how its weights change.

It builds the model (the family's tiny twin, a local or Hub checkpoint, or the checkpoint a run
resumes from; LoRA on top, parts frozen), places it, runs its forwards (per-token logprobs of
completions, in the layout `choose_layout` picked), gathers its weights whole for rollout and
evaluation (`full_params`), and holds the KL reference: a frozen copy saved in the run dir, or,
under LoRA, the same model with the adapter off. The Learner (train/learner.py) changes the
weights; the strategy it shares with the Learner says how the weights are spread over processes.
"""
from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mmrl.config import RunConfig
from mmrl.models.codec import Codec
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models import source, ulysses
from mmrl.models.encoder_cache import EncoderCache
from mmrl.models.media_embeds import local_encoder
from mmrl.models.shared_prefix import (enable_shared_prefix, shared_prefix_logprobs,
                                       split_groups, token_budget_micro_batches, uses_varlen)
from mmrl.models.towers import TowerToucher
from mmrl.train import checkpoint, dist, lora
from mmrl.types import RolloutBatch

if TYPE_CHECKING:
    from mmrl.models.base import ModelAdapter
    from mmrl.train.parallel import Strategy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Policy:
    # What other files may read (tests/train/test_structure.py holds every file to it).
    PUBLIC = ("info", "codec", "model", "device", "sequence", "to_save", "full_params", "attach",
              "choose_layout", "micro_batches", "forward", "logprobs", "step_logprobs",
              "fix_reference", "metrics")

    def __init__(self, cfg: RunConfig, info: dist.DistInfo, strategy: Strategy,
                 adapter: ModelAdapter, weights: Path | None = None,
                 sequence: ulysses.SPGroup = ulysses.SPGroup()):
        """`weights`: a checkpoint to load the model from (resume), else model.path.
        `sequence`: the ranks each training forward's sequence is split over (train/sp.py)."""
        self.info, self.strategy = info, strategy
        self.sequence = sequence
        self.algo, self.micro_batch_size = cfg.algo, max(1, cfg.train.micro_batch_size)
        self.max_tokens = cfg.train.max_tokens_per_micro_batch  # None: cut by rows
        self.temperature = cfg.rollout.temperature
        strategy.before_model()
        self.model, processor, self.peft = build_model(cfg, adapter, weights)
        # The family's adapter bound to its processor, once: tokenizer and image facts,
        # features, decoding, and what the engines ask (models/codec.py).
        self.codec = Codec(adapter, processor)
        self.device = torch.device(f"cuda:{info.local_rank}" if torch.cuda.is_available()
                                   else "cpu")
        if not strategy.places_model:  # DeepSpeed and FSDP2 place (and shard) it themselves
            self.model.to(self.device)
        self.train_model = self.model  # what training forwards call (attach)
        self.touch_towers: TowerToucher | None = None
        self.shared_prefix, self.pack_stats = False, {}  # decided by choose_layout
        self.reference = None  # the KL reference module (fix_reference); None under LoRA
        # Frozen encoders' outputs, once per prompt per step (begin_step). Tool-use rows carry
        # observation media the cache does not hold: there every forward encodes.
        self.encoders = EncoderCache(
            self.model, cfg.train.cache_frozen_encoders and not cfg.multi_turn,
            off="multi-turn rows carry observation media" if cfg.multi_turn
            else "train.cache_frozen_encoders=false")
        self._cached_batch: RolloutBatch | None = None  # the batch the cache was filled for
        self._reference_dir = Path(cfg.run_dir) / "reference"

    def attach(self, module) -> None:
        """Training forwards go through `module`: the model itself, or the DeepSpeed engine the
        strategy wrapped it in (the Learner calls this once the strategy set it up)."""
        self.train_model = module
        if self.strategy.every_module:
            self.touch_towers = TowerToucher(self.model, self.codec)

    def choose_layout(self, wanted: bool) -> None:
        """One packed row per group: the prompt and its media run once, not G times (same
        logprobs and gradients to 1e-5); flash_attention_2 switches to the varlen kernel. Called
        once the rollout engine is built, so the engine starts from the model as loaded."""
        self.shared_prefix, why = enable_shared_prefix(self.model, wanted)
        self.pack_stats = {}  # pad_fraction of the last packed forward
        # Ulysses wraps the layout's kernel; unsplit calls (generation, evaluation) pass through.
        split = ulysses.install(self.model, self.sequence)
        if self.info.main:
            print(why, flush=True)
            if self.sequence.size > 1:
                print(split, flush=True)
            print(self.encoders.summary, flush=True)

    def full_params(self, enabled: bool = True):
        """Inside: every weight whole on every rank (generation, weight sync, evaluation)."""
        return self.strategy.full_params(self.model) if enabled else nullcontext()

    @property
    def to_save(self):
        """What a checkpoint writes: the LoRA wrapper (adapter-only files) or the model."""
        return self.peft or self.model

    # ---------------------------------------------------------------- forwards -----------------
    def begin_step(self, batch: RolloutBatch) -> None:
        """After the rollout: forget the last step's encoder outputs and encode `batch`'s media
        for every frozen encoder now, each prompt once (ZeRO-3 / FSDP2: each rank calls each
        encoder equally often, a dummy where a prompt lacks the kind); the step's forwards of
        `batch` (old, reference, every update iteration) then take them from the cache."""
        self.encoders.clear()
        self._cached_batch = None
        if self.encoders.on:
            dummies = self.touch_towers.dummies if self.touch_towers else None
            inner = (ulysses.ShardedEncoder(self.sequence, touch=self.strategy.every_module)
                     if self.sequence.size > 1 else local_encoder)
            self.encoders.fill(self.model, batch.prompts, dummies, inner)
            self._cached_batch = batch

    def micro_batches(self, batch: RolloutBatch) -> list[list[int]]:
        """The rows of each forward: `train.micro_batch_size` rows, or as many rows (groups under
        the shared-prefix layout) as fit `train.max_tokens_per_micro_batch` tokens. Under
        ZeRO-2/3 and FSDP2 (a forward and backward are collectives) every rank gets as many: a
        rank that needs fewer ends with empty ones, which `forward` runs on row 0 for the caller
        to weight 0. DDP's one all-reduce per step needs no such agreement."""
        n = batch.n
        if self.max_tokens is None:
            mb = self.micro_batch_size
            return [list(range(i, min(n, i + mb))) for i in range(0, n, mb)]

        def plan(least: int = 1) -> list[list[int]]:
            return token_budget_micro_batches(
                batch.prompts, batch.completion_mask, self.max_tokens,
                shared_prefix=self.shared_prefix, padded=not uses_varlen(self.model),
                min_batches=least)
        chunks = plan()
        if not self.strategy.every_module:
            return chunks
        count = dist.all_max(len(chunks), self.info)
        if count > len(chunks):
            chunks = plan(count)
        return chunks + [[] for _ in range(count - len(chunks))]

    def forward(self, batch: RolloutBatch, rows: list[int], entropy: bool = False, module=None):
        """-> (logp [rows, width] (, entropy)), width) for `rows` (none: row 0, see
        micro_batches) through the training module (or `module`), trimmed to their longest
        completion; under ZeRO-2/3 / FSDP2 every encoder runs, media present or not."""
        rows = rows or [0]
        cached = batch is self._cached_batch
        if self.touch_towers is not None:  # the cached kinds ran in begin_step, on every rank
            self.touch_towers.skip = set(self.encoders.kinds) if cached else set()
        with self.touch_towers() if self.touch_towers else nullcontext():
            return self._forward_rows(module or self.train_model, batch, rows, entropy, cached)

    def _forward_rows(self, module, batch: RolloutBatch, rows: list[int], entropy: bool,
                      cached: bool):
        sub = batch.select(rows)
        if self.sequence.size > 1:
            return self._split_logprobs(module, sub, entropy, cached)
        if self.shared_prefix:  # under a dense mask, groups pack in the runs that cost least
            sub = dataclasses.replace(sub, prompts=split_groups(self.model, sub.prompts,
                                                                sub.completion_mask))
        serve = self.encoders.serve(module, sub.prompts, self.shared_prefix) if cached else None
        with serve or nullcontext():
            return self._logprobs_of(module, sub, entropy)

    def _split_logprobs(self, module, sub: RolloutBatch, entropy: bool, cached: bool):
        """Sequence parallelism: this rank runs 1/N of each sequence, every rank of the group
        gets the whole [rows, width] (models/ulysses.py). Media this rank encodes: its share of
        the units, or the step's cached frozen-encoder outputs."""
        width = int(sub.completion_mask.sum(1).max().clamp(min=1))
        ids, mask = sub.completion_ids[:, :width], sub.completion_mask[:, :width]
        encoder = ulysses.ShardedEncoder(self.sequence, touch=self.strategy.every_module)
        provider = (self.encoders.provider(sub.prompts, self.shared_prefix, inner=encoder)
                    if cached and self.encoders.on else encoder)
        out = ulysses.sequence_parallel_logprobs(
            module, sub.prompts, ids, mask, self.sequence, shared_prefix=self.shared_prefix,
            temperature=self.temperature, return_entropy=entropy,
            placeholder_ids=self.codec.placeholder_ids, pad_id=self.codec.pad_id, provider=provider,
            stats=self.pack_stats if self.shared_prefix else None)
        return out, width

    def _logprobs_of(self, module, sub: RolloutBatch, entropy: bool):
        width = int(sub.completion_mask.sum(1).max().clamp(min=1))  # drop all-pad columns
        ids, mask = sub.completion_ids[:, :width], sub.completion_mask[:, :width]
        # Tool-use rows: each observation's media after its prompt's, in token order; the values
        # on observation tokens are not the policy's and every loss masks them (policy_mask).
        observations = sub.observations()
        if self.shared_prefix:
            return shared_prefix_logprobs(
                module, sub.prompts, ids.to(self.device), mask.to(self.device),
                temperature=self.temperature, return_entropy=entropy,
                placeholder_ids=self.codec.placeholder_ids, pad_id=self.codec.pad_id,
                stats=self.pack_stats, observations=observations), width
        inputs = collate(sub.prompts, ids, mask, self.codec.pad_id, observations=observations)
        inputs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        out = completion_logprobs(module, inputs, ids.to(self.device),
                                  sub.policy_mask[:, :width].to(self.device),
                                  temperature=self.temperature, return_entropy=entropy,
                                  placeholder_ids=self.codec.placeholder_ids)
        return out, width

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, module=None) -> torch.Tensor:
        """[N, L] float32 logprobs of the completions under the policy as it is now (or under
        `module`), zero past each completion."""
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
        module = module or self.train_model
        module.eval()
        for rows in self.micro_batches(batch):
            logp, width = self.forward(batch, rows, module=module)
            if rows:  # an empty micro-batch only keeps the ranks' forwards in step
                out[rows, :width] = logp.float().cpu()
        return out

    def step_logprobs(self, batch: RolloutBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(old, reference) logprobs of a step's `batch`, each None when the step needs none;
        the frozen encoders run once per prompt first (begin_step)."""
        self.begin_step(batch)
        return self.old_logprobs(batch), self.reference_logprobs(batch)

    def old_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Stored before the first update when the rollout is reused (num_iterations > 1) or the
        KL goes into the reward (it needs the policy's logprobs before the update)."""
        if self.algo.num_iterations > 1 or self.algo.kl_reward_coef > 0:
            return self.logprobs(batch)
        return None

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        if self.reference is not None:
            return self.logprobs(batch, self.reference)
        if self.algo.uses_reference and self.peft is not None:  # LoRA: reference = adapter off
            with lora.reference_context(self.peft):
                return self.logprobs(batch, self.model)
        return None

    def metrics(self) -> dict[str, float]:
        out = {"train/shared_prefix": float(self.shared_prefix)}
        if self.shared_prefix:
            out["train/pad_fraction"] = self.pack_stats.get("pad_fraction", 0.0)
            out["train/rows_per_pack"] = self.pack_stats.get("rows_per_pack", 0.0)
        return out

    # ---------------------------------------------------------------- the KL reference ---------
    def fix_reference(self, steps_done: int = 0) -> None:
        """Fix the KL reference as the policy is now (RL starts, after any SFT warm-up): none
        without a KL term, the adapter switched off under LoRA, else a frozen copy saved in the
        run dir once, so that a resumed run keeps this reference, not the resumed policy.
        After an update (`steps_done` > 0): ProRL's refresh when it is due (refresh_reference)."""
        if steps_done:
            return self.refresh_reference(steps_done)
        if self.algo.ref_reset_every and (self.peft is not None or self.strategy.shards_params):
            raise ValueError("algo.ref_reset_every: resetting the reference needs full fine-tuning "
                             "without ZeRO-3/FSDP2 parameter sharding")
        if not self.algo.uses_reference or self.reference is not None or self.peft is not None:
            return
        # A resumed run's saved reference. Every rank looks before rank 0 writes one: a rank that
        # looked later found the folder rank 0 was still filling and failed to load it.
        saved = self._reference_dir.is_dir()
        dist.barrier(self.info)
        if not saved and self.strategy.shards_params:
            self._save_sharded_reference()  # no whole copy in memory
            saved = True
        if saved:
            self.reference = self._load_reference()
            return
        self.reference = _frozen(copy.deepcopy(self.model))
        if self.info.main:  # with the processor, so adapter.load can read it back
            self.reference.save_pretrained(self._reference_dir)
            self.codec.processor.save_pretrained(self._reference_dir)

    def _save_sharded_reference(self) -> None:
        weights = self.strategy.full_state_dict(self.model)
        if self.info.main:
            self.model.save_pretrained(self._reference_dir, state_dict=weights)
            checkpoint.hf_config(self.model).save_pretrained(self._reference_dir)
            self.codec.processor.save_pretrained(self._reference_dir)
        dist.barrier(self.info)

    def _load_reference(self):
        ref, _ = self.codec.adapter.load(str(self._reference_dir),
                                   dtype=next(self.model.parameters()).dtype)
        if not self.strategy.places_model:
            ref.to(self.device)
        ulysses.install(ref, self.sequence)  # its forwards split as the policy's do
        ref = self.strategy.frozen(_frozen(ref))
        if self.touch_towers is not None and self.strategy.shards_params:
            self.touch_towers.attach(ref)  # its forwards gather too
        return ref

    def refresh_reference(self, steps_done: int) -> None:
        """ProRL (algo.ref_reset_every): every N steps the KL reference becomes a copy of the
        current policy (saved, so a resumed run keeps it). Only where both are whole modules in
        this process (checked in `fix_reference`)."""
        every = self.algo.ref_reset_every
        if self.reference is None or not every or steps_done % every:
            return
        with torch.no_grad():
            self.reference.load_state_dict(self.model.state_dict())
        if self.info.main:
            self.reference.save_pretrained(self._reference_dir)
        dist.barrier(self.info)


def _frozen(model):
    model.requires_grad_(False)
    model.eval()
    return model


# ---------------------------------------------------------------- building the model ----------
def build_model(cfg: RunConfig, adapter: ModelAdapter, checkpoint_dir: Path | None = None):
    """-> (model, processor, peft_model or None). From a checkpoint when resuming (an adapter-only
    LoRA checkpoint is applied on top of model.path), else from model.path / tiny."""
    m = cfg.model
    full_ckpt = checkpoint_dir is not None and not lora.is_adapter_checkpoint(checkpoint_dir)
    origin = source.LocalDir(Path(checkpoint_dir)) if full_ckpt else source.parse(m.path)
    model, processor = origin.build(adapter, dtype=DTYPES[m.dtype],
                                    attn_implementation=m.attn_implementation,
                                    seed=cfg.train.seed, tiny=m.tiny)
    _image_budget(processor, cfg)
    peft_model = None
    if checkpoint_dir is not None and not full_ckpt:
        peft_model = lora.load(model, checkpoint_dir)
    elif m.lora.r > 0:
        peft_model = lora.wrap(model, m.lora, adapter)
    freeze(model, m.freeze, adapter)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model, processor, peft_model


def _image_budget(processor, cfg: RunConfig) -> None:
    """data.image_min/max_pixels on the processor too, so images the processor resizes itself
    land in the frame the rewards map boxes through."""
    ip = getattr(processor, "image_processor", None)
    if ip is None:
        return
    for key in ("image_min_pixels", "image_max_pixels"):
        value = getattr(cfg.data, key)
        if value is not None:
            attr = key.replace("image_", "")
            edge = "shortest_edge" if attr == "min_pixels" else "longest_edge"
            size = getattr(ip, "size", None)
            # transformers 5 reads the budget from `size` (a SizeDict); a min_pixels / max_pixels
            # attribute would be passed to every call as a deprecated kwarg, a FutureWarning each
            if isinstance(size, dict) or hasattr(size, edge):
                size[edge] = value
            else:
                setattr(ip, attr, value)


def freeze(model, names: list[str], adapter: ModelAdapter) -> None:
    """Freeze parameters by family part (vision, audio, language) or by name prefix."""
    parts = getattr(adapter, "module_prefixes", {})
    prefixes = [parts.get(n, n) for n in names]
    prefixes = [p for group in prefixes for p in ([group] if isinstance(group, str) else group)]
    hit = set()
    for name, param in model.named_parameters():
        for p in prefixes:
            if name.startswith(p):
                param.requires_grad_(False)
                hit.add(p)
    missing = [p for p in prefixes if p not in hit]
    if missing:
        raise ValueError(f"model.freeze: {missing} matched no parameter; parts known for this "
                         f"family: {sorted(parts)}")
