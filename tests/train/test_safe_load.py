"""Sharded checkpoints load without running code: torch DCP's metadata and non-tensor items and
DeepSpeed's shards are read here the safe way before their libraries unpickle them, so a crafted
file is refused, naming it, on resume and in `mmrl checkpoint consolidate`; a real one passes."""
from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch

from mmrl.cli import main
from mmrl.train import checkpoint, verify
from mmrl.train.consolidate import full_state_dict


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['MMRL_SAFE_MARKER']}",))


@pytest.fixture()
def marker(tmp_path, monkeypatch):
    path = tmp_path / "pwned"
    monkeypatch.setenv("MMRL_SAFE_MARKER", str(path))
    return path


def _dcp(folder, extra=None) -> None:
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), **(extra or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(folder / "dcp"))


def _state_file(ckpt) -> None:
    torch.save({"step": 1}, ckpt / checkpoint.STATE_FILE)


def test_real_dcp_checkpoint_passes_and_a_crafted_metadata_is_refused(tmp_path, marker):
    ckpt = tmp_path / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    _dcp(ckpt)  # model weights plus the optimizer's non-tensor items (lr, betas, ...)
    _state_file(ckpt)
    verify.check_pickles(ckpt)
    assert verify.problem(ckpt) is None
    with (ckpt / "dcp" / ".metadata").open("wb") as f:
        pickle.dump({"state_dict_metadata": _Exploit()}, f)
    why = verify.problem(ckpt)
    assert why == (f"refusing to load {ckpt / 'dcp' / '.metadata'}: it would build posix.system: "
                   f"it holds objects other than tensors and plain data")
    with pytest.raises(checkpoint.CheckpointError, match="it would build posix.system"):
        checkpoint.resolve_resume(str(ckpt), tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=r"dcp/.metadata: it would build"):
        full_state_dict(ckpt)  # what `mmrl checkpoint consolidate` reads
    assert not marker.exists()


def test_a_crafted_non_tensor_dcp_item_is_refused(tmp_path, marker):
    ckpt = tmp_path / "step_000001"
    ckpt.mkdir()
    _dcp(ckpt, {"extra": _Exploit()})  # torch.save'd into a .distcp, unpickled by the planner
    _state_file(ckpt)
    with pytest.raises(verify.UnsafeCheckpoint, match=r"__0_0.distcp \(item extra\): Weights only "
                                                      r"load failed"):
        verify.check_pickles(ckpt)
    assert not marker.exists()


def test_a_crafted_deepspeed_shard_is_refused_by_consolidate(tmp_path, marker, capsys):
    pytest.importorskip("deepspeed")
    ckpt = tmp_path / "step_000002"
    (ckpt / "deepspeed" / "shards").mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(2)}, "ds_version": "0.19.8", "hook": _Exploit()},
               ckpt / "deepspeed" / "shards" / "mp_rank_00_model_states.pt")
    assert main(["checkpoint", "consolidate", str(ckpt)]) == 1
    err = capsys.readouterr().err
    assert f"refusing to load {ckpt}/deepspeed/shards/mp_rank_00_model_states.pt: Weights only " \
           f"load failed" in err and "Only load checkpoints you wrote yourself" in err
    assert not marker.exists()
    # DeepSpeed's own plain records (a loss scaler, the ZeRO stage) are allowed.
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    torch.save({"module": {"w": torch.zeros(2)}, "loss_scaler": LossScaler(1.0),
                "zero_stage": ZeroStageEnum(1)},
               ckpt / "deepspeed" / "shards" / "mp_rank_00_model_states.pt")
    verify.check_pickles(ckpt)
