"""`VLLMServerEngine`: rollouts from a running `vllm serve` on other GPUs (scripts/vllm_server.sh),
and `python -m mmrl.rollout.vllm_server export`, which writes the checkpoint the server loads."""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch

from mmrl.config_rules import WEIGHT_TRANSFER, resolve_weight_transfer
from mmrl.models.codec import Codec
from mmrl.models.forward import Generation
from mmrl.rollout.vllm_io import (ban_fields, build_request, describe, media_pad_ids,
                                  to_generation)
from mmrl.rollout.vllm_weights import export_for_vllm, vllm_state_dict
from mmrl.types import PromptFeatures, SamplingParams


def _data_url(item, kind: str) -> str:
    import base64
    import io

    buf = io.BytesIO()
    if kind == "image":
        item.save(buf, format="PNG")  # lossless: the server sees the same pixels
        mime = "image/png"
    else:
        import soundfile

        wave, rate = item
        soundfile.write(buf, wave, rate, format="WAV", subtype="FLOAT")  # no 16-bit requantising
        mime = "audio/wav"
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode()}"


def generate_request(prompt: PromptFeatures, pads: dict[str, int]) -> dict:
    """The body of vLLM's token-in endpoint (/inference/v1/generate) for one prompt, sampling
    parameters aside: the trainer's token ids with one pad per media item (vllm_io.build_request,
    as the colocated engine sends them) and the media as lossless data URLs (`content_parts`),
    which the server decodes and expands into its own prompt -- a tool trajectory's model
    tokens are never re-tokenized and its observations' media follow the prompt's in order."""
    request = build_request(prompt, pads)
    data = request.get("multi_modal_data", {})
    if "video" in data:
        raise NotImplementedError(f"{describe(prompt)}: server mode sends media as data URLs and a "
                                  f"video URL would be decoded and its frames sampled again by the "
                                  f"server; use the colocated VLLMEngine for video")
    # vLLM groups the parts by modality: each modality's items keep their order.
    parts = [{"type": f"{kind}_url", "url": _data_url(item, kind)}
             for kind in ("image", "audio") for item in data.get(kind, ())]
    return {"token_ids": request["prompt_token_ids"], "content_parts": parts or None}


class VLLMServerEngine:
    """Rollouts from a running `vllm serve` (OpenAI-compatible HTTP), e.g. on other GPUs.

    Every prompt goes to vLLM's token-in endpoint /inference/v1/generate (`--enable-scale-out`)
    as the trainer's token ids with its images and audio as lossless data URLs
    (`generate_request`): the request the colocated engine makes, over HTTP, so a tool
    trajectory continues from its own token ids. The prompt ids the server expands to must
    equal the trainer's (else ValueError). The temperature trick, the trainer's M-RoPE positions
    and weight pushes use the dev-mode /collective_rpc endpoint (`VLLM_SERVER_DEV_MODE=1` and
    `--worker-extension-cls mmrl.rollout.worker_ext.WeightSync`, see scripts/vllm_server.sh).

    Weights travel (`weight_transfer`) as base64 safetensors in JSON ("http": fine for small
    models), or are broadcast from this process to every server worker ("nccl" on GPUs: a
    StatelessProcessGroup rendezvous on the server host's `weight_transfer_port`, then one NCCL
    broadcast per tensor while the workers stream them into the model; "store": the same
    protocol over the rendezvous TCP store, which is what CPU tests can run).
    """
    samples_from_training_model = False

    def __init__(self, base_url: str, codec: Codec, *, model: str | None = None,
                 timeout: float = 600.0, eos_ids: Sequence[int] | None = None,
                 max_workers: int = 16, weight_transfer: str = "auto",
                 weight_transfer_port: int = 51216):
        if weight_transfer not in WEIGHT_TRANSFER["server"]:
            raise ValueError(f"server mode rollout.vllm.weight_transfer={weight_transfer!r}: use "
                             f"{' | '.join(WEIGHT_TRANSFER['server'])}")
        self.transfer = resolve_weight_transfer(weight_transfer, "server")
        self.transfer_port, self._comm = weight_transfer_port, None
        self.base_url = base_url.rstrip("/")
        self.codec, self.timeout = codec, timeout
        tokenizer = codec.tokenizer
        self.tokenizer, self.pad_id = tokenizer, codec.pad_id
        if eos_ids is None:
            eos = tokenizer.eos_token_id
            eos_ids = [eos] if isinstance(eos, int) else list(eos)
        self.eos_ids = list(eos_ids)
        self.placeholder_ids = codec.placeholder_ids
        self.pads = media_pad_ids(codec.processor)
        self.max_workers = max_workers
        self.model = model or self._get("/v1/models")["data"][0]["id"]
        self._scale = None
        self._rpc("use_trainer_positions", codec.trainer_rope)  # as the colocated engine

    @classmethod
    def from_config(cls, vcfg, codec: Codec) -> "VLLMServerEngine":
        """From a VLLMConfig (`rollout.vllm`) whose server_url is set."""
        return cls(vcfg.server_url, codec, weight_transfer=vcfg.weight_transfer,
                   weight_transfer_port=vcfg.weight_transfer_port)

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        import json
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"vllm serve {path}: HTTP {e.code}: {e.read()[:2000].decode(errors='replace')}") from None
        return json.loads(raw) if raw else {}

    def _get(self, path: str) -> dict:
        return self._request("GET", path)

    def _post(self, path: str, body: dict | None = None) -> dict:
        return self._request("POST", path, body or {})

    def _rpc(self, method: str, *args: str) -> list:
        return self._post("/collective_rpc", {"method": method, "args": list(args)}).get("results", [])

    def _one(self, prompt: PromptFeatures, params: dict) -> tuple[list[int], list]:
        """(server's prompt ids, choices) for one prompt."""
        body = dict(generate_request(prompt, self.pads), model=self.model, sampling_params=params,
                    return_token_ids=True)
        out = self._post("/inference/v1/generate", body)
        choices = [(c["index"], c["token_ids"], [t["logprob"] for t in c["logprobs"]["content"]],
                    c["finish_reason"]) for c in out["choices"]]
        return out.get("prompt_token_ids"), choices

    def generate(self, prompts: Sequence[PromptFeatures],
                 sampling: SamplingParams = SamplingParams()) -> Generation:
        from concurrent.futures import ThreadPoolExecutor

        s = sampling
        temperature, do_sample, top_p, top_k = s.temperature, s.do_sample, s.top_p, s.top_k
        suppress_ids, seed, eos_ids = s.suppress_ids, s.seed, s.eos_ids
        scale = 1.0 / temperature if temperature > 0 else 1.0
        if scale != self._scale:
            self._rpc("set_logit_scale", repr(scale))
            self._scale = scale
        g, n = s.num_generations, (s.num_generations if do_sample else 1)
        banned = sorted(set(int(i) for i in suppress_ids))
        ban = ban_fields(self.tokenizer, banned)
        base = dict(n=n, temperature=1.0 if do_sample else 0.0,
                    top_p=top_p if do_sample else 1.0, top_k=top_k if do_sample and top_k > 0 else 0,
                    max_tokens=s.max_new_tokens, logprobs=0, detokenize=False,
                    stop_token_ids=list(eos_ids) if eos_ids is not None else self.eos_ids,
                    bad_words=ban["bad_words"] or [],
                    logit_bias={str(k): v for k, v in (ban["logit_bias"] or {}).items()} or None)
        params = [dict(base, seed=None if seed is None else seed + i * g) for i in range(len(prompts))]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(prompts))) as pool:
            results = list(pool.map(self._one, prompts, params))
        rows = []
        for prompt, (prompt_ids, choices) in zip(prompts, results):
            if prompt_ids is not None and list(prompt_ids) != prompt.input_ids.tolist():
                raise ValueError(f"{describe(prompt)}: the server's prompt ({len(prompt_ids)} tokens) "
                                 f"differs from the trainer's ({prompt.input_ids.numel()}): the chat "
                                 f"templates or processors disagree")
            choices = sorted(choices, key=lambda c: c[0]) * (g // n)
            rows += [(ids, lps, reason == "length") for _, ids, lps, reason in choices]
        try:
            return to_generation(rows, self.pad_id, sorted(set(banned) | set(self.placeholder_ids)))
        except ValueError as e:
            raise ValueError(f"vLLM server sampled a banned token: {e}") from None

    def sync_weights(self, model) -> None:
        """Push `model`'s weights (see `weight_transfer`), then reset the server's caches."""
        self.push_state(vllm_state_dict(model, self.codec.adapter))

    def push_state(self, state: dict[str, torch.Tensor]) -> None:
        """Push a `vllm_state_dict` (the async sampler stages one per weight version), then
        reset the server's caches."""
        counts = self._broadcast(state) if self.transfer in _BROADCASTS else self._send_http(state)
        if any(int(c) != len(state) for c in counts):
            raise RuntimeError(f"weight sync: server workers read {counts} tensors, sent {len(state)}")
        self._post("/reset_prefix_cache")
        self._post("/reset_encoder_cache")

    def loaded_fingerprints(self) -> list[dict[str, list[float]]]:
        """Per server worker: {name: [float64 sum, sum of absolute values]} of the tensors its
        last weight load received (worker_ext.WeightSync.loaded_fingerprint)."""
        return self._rpc("loaded_fingerprint")

    def _send_http(self, state: dict[str, torch.Tensor]) -> list:
        import base64

        from safetensors.torch import save

        blob = save({k: v.detach().contiguous().cpu() for k, v in state.items()})
        return self._rpc("load_weights_b64", base64.b64encode(blob).decode())

    def _join_weight_group(self) -> None:
        """Rendezvous with every server worker (ranks 0..W-1; this process is rank W)."""
        from urllib.parse import urlparse

        from vllm.distributed.utils import StatelessProcessGroup

        workers = len(self._rpc("parameter_count"))
        host, world = urlparse(self.base_url).hostname, workers + 1
        join, result = _in_thread(self._rpc, "init_weight_group", host, str(self.transfer_port),
                                  str(world), self.transfer)  # the workers block in the rendezvous until this process joins too
        group = StatelessProcessGroup.create(host=host, port=self.transfer_port, rank=workers,
                                             world_size=world)
        self._comm = _BROADCASTS[self.transfer].communicator(group)
        join.join()
        if "failed" in result:
            raise RuntimeError(f"weight group rendezvous failed on the server: {result['failed']}")
        self._src = workers

    def _broadcast(self, state: dict[str, torch.Tensor]) -> list:
        """Tell the workers what is coming, then broadcast each tensor in that order."""
        import json

        if self._comm is None:
            self._join_weight_group()
        manifest = [(k, str(v.dtype).removeprefix("torch."), list(v.shape)) for k, v in state.items()]
        receive, result = _in_thread(self._rpc, "receive_weights", json.dumps(manifest))
        device = _BROADCASTS[self.transfer].device()
        for tensor in state.values():
            self._comm.broadcast(tensor.detach().to(device).contiguous(), src=self._src)
        receive.join()
        if "failed" in result:
            raise RuntimeError(f"weight broadcast failed on the server: {result['failed']}")
        return result["value"]

    def close(self) -> None:
        pass


def _nccl_communicator(group):
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    return PyNcclCommunicator(group, device=torch.cuda.current_device())


class _Broadcast(NamedTuple):
    communicator: Callable  # the rendezvous group -> what broadcasts the tensors
    device: Callable[[], torch.device]  # where the tensors go from


# The weight_transfer values that broadcast to the workers (the rest, http, post the bytes).
_BROADCASTS = {
    "nccl": _Broadcast(_nccl_communicator, lambda: torch.device("cuda", torch.cuda.current_device())),
    "store": _Broadcast(lambda group: group, lambda: torch.device("cpu")),
}


def _in_thread(fn, *args):
    """Run `fn(*args)` in a started thread -> (thread, dict that gets "value" or "failed")."""
    import threading

    result: dict = {}

    def run():
        try:
            result["value"] = fn(*args)
        except Exception as e:  # re-raised by the caller after join
            result["failed"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _export_main(argv: Sequence[str] | None = None) -> None:
    """python -m mmrl.rollout.vllm_server export --family F --model PATH|tiny --out DIR [--tiny-json J]"""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m mmrl.rollout.vllm_server")
    sub = parser.add_subparsers(dest="cmd", required=True)
    exp = sub.add_parser("export", help="write a checkpoint dir that vLLM loads (names remapped)")
    exp.add_argument("--family", required=True)
    exp.add_argument("--model", required=True, help="HF checkpoint dir / hub id, or 'tiny'")
    exp.add_argument("--out", required=True)
    exp.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    exp.add_argument("--tiny-json", default="{}", help="tiny() overrides as JSON")
    args = parser.parse_args(argv)
    from mmrl.models import get_adapter, source

    adapter = get_adapter(args.family)
    model, processor = source.parse(args.model).build(
        adapter, dtype=getattr(torch, args.dtype), attn_implementation="sdpa",
        tiny=json.loads(args.tiny_json))
    print(export_for_vllm(model, Codec(adapter, processor), args.out))


if __name__ == "__main__":
    _export_main()
