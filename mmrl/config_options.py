"""The legal values of the run configuration's options (the `Literal` types of its keys),
re-exported by mmrl.config beside the sections that use them; the `algo:` section's are in
config_algo.py. OmegaConf (>= 2.4) rejects anything else at load time with the key's path; code
downstream may rely on the value being one of these, and compares them only in config.py,
config_algo.py and config_rules.py (tests/test_option_dispatch.py)."""
from __future__ import annotations

from typing import Literal

OnBadSample = Literal["error", "skip"]  # error: stop naming record and file | skip: skip and count
AudioTruncate = Literal["error", "head"]  # longer audio: error (name the file) | head (keep start)
DType = Literal["float32", "bfloat16", "float16"]
AttnImplementation = Literal["sdpa", "eager", "flash_attention_2", "mmrl_prefix_varlen"]
WeightTransfer = Literal["auto", "bytes", "direct", "http", "nccl", "store"]
Backend = Literal["hf", "vllm"]
# hf backend: decode on a static KV cache with a compiled step (docs/performance.md). auto:
# compiled on CUDA where the family compiles, else eager; compiled: always (a config error where
# the family cannot compile); eager: the model's own forward per token.
CompileDecode = Literal["auto", "compiled", "eager"]
LRSchedule = Literal["constant", "linear", "cosine"]
Parallel = Literal["auto", "ddp", "deepspeed", "fsdp2"]
Progress = Literal["auto", "bar", "lines", "off"]
# Before loading the model on CUDA, the memory plan (docs/memory.md) for the device, process
# count and strategy: refuse (stop, with the fix) | warn (say so, go on) | off.
MemoryCheck = Literal["refuse", "warn", "off"]
# <tool_call>{"name", "arguments"}</tool_call> | MGPO's {"bbox_2d"} (crop) | {"span"} (frames)
CallFormat = Literal["qwen", "json_box", "json_span"]
