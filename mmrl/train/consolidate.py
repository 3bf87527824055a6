"""`mmrl checkpoint consolidate`: a sharded ZeRO / FSDP2 checkpoint -> one Hugging Face model.

Runs in one process on CPU, without the processes that wrote the shards: DeepSpeed's own
`zero_to_fp32` merges ZeRO partitions, torch DCP's loader (as `dcp_to_torch_save` calls it)
merges FSDP2's DCP shards. The checkpoint verifies first (mmrl/train/verify.py), and both
readers run inside `verify.only_weights()`: no pickle in it is loaded in full.
The result loads with `from_pretrained` (and as `model.path` of a new run, or `mmrl eval`).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from mmrl.train import verify
from mmrl.train.checkpoint import CheckpointError


def sharded_kind(ckpt: Path) -> str | None:
    """"deepspeed", "dcp", or None for a checkpoint without shards."""
    ckpt = Path(ckpt)
    if (ckpt / "deepspeed").is_dir():
        return "deepspeed"
    if (ckpt / "dcp").is_dir():
        return "dcp"
    return None


def _from_zero(ckpt: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    with verify.only_weights():  # zero_to_fp32 asks torch.load for weights_only=False
        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt / "deepspeed"), tag="shards")


def _from_dcp(ckpt: Path) -> dict[str, torch.Tensor]:
    # What dcp_to_torch_save does, with the safe metadata reader and without the round trip
    # through a torch.save file.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    with verify.only_weights():
        _load_state_dict(state, storage_reader=verify.safe_dcp_reader(ckpt / "dcp"),
                         planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state["model"]


# The whole state dict per sharded layout (sharded_kind: the checkpoint's sub-directory)
_FULL_STATE = {"deepspeed": _from_zero, "dcp": _from_dcp}


def full_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model's whole state dict (float32 for ZeRO, the saved dtype for FSDP2)."""
    kind = sharded_kind(ckpt)
    if kind in _FULL_STATE:
        why = verify.problem(Path(ckpt), need_state=False)  # every file, before any is read
        if why:
            raise CheckpointError(f"{ckpt} cannot be read: {why}. Only load checkpoints you "
                                  f"wrote yourself.")
        return _FULL_STATE[kind](Path(ckpt))
    raise ValueError(f"{ckpt} has no sharded weights (no deepspeed/ or dcp/ inside); it is "
                     f"already a Hugging Face model directory")


def consolidate(ckpt: Path, out: Path) -> Path:
    """Write `out` = config + weights (in the config's dtype) + processor files of `ckpt`."""
    import transformers

    ckpt, out = Path(ckpt), Path(out)
    state = full_state_dict(ckpt)
    config = transformers.AutoConfig.from_pretrained(ckpt)
    cls = getattr(transformers, config.architectures[0])
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with torch.device("meta"):
        model = cls(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = set(getattr(model, "all_tied_weights_keys", None) or
               getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"{ckpt}: shards do not match {cls.__name__}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.tie_weights()
    model.to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in ckpt.iterdir():  # processor / tokenizer / generation files, not state or shards
        if f.is_file() and f.name not in ("config.json", "trainer_state.pt") and \
                not (out / f.name).exists():
            shutil.copy2(f, out / f.name)
    return out
