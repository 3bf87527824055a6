"""Crafted checkpoints run no code on resume or consolidate (issue #56, items 3 and 4).

Each craft is what an attacker with write access to a checkpoint could do, manifest rewritten
to match where that helps them: a shards folder or file that is a symlink out of the
checkpoint, a hard link, a renamed or extra shard, a pickle that reaches `os.system`, a DCP item
stored outside `dcp/`. Every one is refused by `verify.problem` (so by `train.resume=auto`,
`train.resume=PATH` and `mmrl checkpoint consolidate`), naming the file, and the marker file the
pickles would write never appears. Behind the check, the loaders themselves run with
`verify.only_weights()`: a crafted pickle handed straight to DeepSpeed's or DCP's reader is
refused too. And a run folder that has held checkpoints never silently restarts."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mmrl import config
from mmrl.cli import main
from mmrl.train import checkpoint, consolidate, rundir, verify

OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
MODEL = "mp_rank_00_model_states.pt"


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['MMRL_CRAFT_MARKER']}",))


@pytest.fixture()
def marker(tmp_path, monkeypatch):
    path = tmp_path / "pwned"
    monkeypatch.setenv("MMRL_CRAFT_MARKER", str(path))
    return path


def _deepspeed_ckpt(run_dir: Path) -> Path:
    """The layout a ZeRO run writes (what zero_to_fp32 and the engine open), with a manifest."""
    ckpt = run_dir / "checkpoints" / "step_000002"
    shards = ckpt / "deepspeed" / "shards"
    shards.mkdir(parents=True)
    torch.save({"step": 2, "run_id": "r"}, ckpt / checkpoint.STATE_FILE)
    (ckpt / "config.json").write_text("{}")
    torch.save({"module": {"w": torch.zeros(2)}, "ds_version": "0.19.8"}, shards / MODEL)
    torch.save({"optimizer_state_dict": {"zero_stage": 2}, "ds_version": "0.19.8"},
               shards / OPTIM)
    verify.write_manifest(ckpt)
    return ckpt


def _dcp_ckpt(run_dir: Path, where: Path | None = None) -> Path:
    import torch.distributed.checkpoint as dcp

    ckpt = run_dir / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    torch.save({"step": 2, "run_id": "r"}, ckpt / checkpoint.STATE_FILE)
    model = torch.nn.Linear(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(where or ckpt / "dcp"))
    return ckpt


def _exploit_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"optimizer_state_dict": _Exploit()}, path)
    return path


def _symlinked_shards(ckpt: Path) -> None:
    evil = ckpt.parents[1] / "evil"
    shutil.copytree(ckpt / "deepspeed" / "shards", evil)
    _exploit_file(evil / MODEL)  # the first file zero_to_fp32 and the engine open
    _exploit_file(evil / OPTIM)
    shutil.rmtree(ckpt / "deepspeed" / "shards")
    (ckpt / "deepspeed" / "shards").symlink_to(evil, target_is_directory=True)
    verify.write_manifest(ckpt)  # lists what it sees: the linked folder's files are not seen


def _symlinked_shard(ckpt: Path) -> None:
    (ckpt / "deepspeed" / "shards" / OPTIM).unlink()
    target = _deepspeed_ckpt(ckpt.parents[1] / "elsewhere") / "deepspeed" / "shards" / OPTIM
    (ckpt / "deepspeed" / "shards" / OPTIM).symlink_to(target)
    verify.write_manifest(ckpt)


def _hard_link(ckpt: Path) -> None:
    outside = ckpt.parents[1] / "outside.pt"  # whoever holds this name can rewrite it later
    shutil.copy(ckpt / "deepspeed" / "shards" / OPTIM, outside)
    (ckpt / "deepspeed" / "shards" / OPTIM).unlink()
    os.link(outside, ckpt / "deepspeed" / "shards" / OPTIM)
    verify.write_manifest(ckpt)


def _renamed_shard(ckpt: Path) -> None:
    shards = ckpt / "deepspeed" / "shards"
    (shards / OPTIM).rename(shards / OPTIM.replace("pp_rank_0", "pp_rank_1"))


def _extra_shard(ckpt: Path) -> None:
    shards = ckpt / "deepspeed" / "shards"
    shutil.copy(shards / OPTIM, shards / OPTIM.replace("pp_rank_0", "pp_rank_1"))


def _exploit_shard(ckpt: Path) -> None:
    _exploit_file(ckpt / "deepspeed" / "shards" / OPTIM)
    verify.write_manifest(ckpt)


CRAFTS = {  # craft -> what the refusal says
    "symlinked shards folder": (_symlinked_shards, "deepspeed/shards is a symbolic link to {root}"
                                                   "/evil (outside the checkpoint)"),
    "symlinked shard": (_symlinked_shard, f"deepspeed/shards/{OPTIM} is a symbolic link to "),
    "hard link": (_hard_link, f"deepspeed/shards/{OPTIM} has 2 hard links"),
    "renamed shard": (_renamed_shard, "zero_pp_rank_1_mp_rank_00_optim_states.pt is not in "
                                      "manifest.json (an extra or renamed file)"),
    "extra shard": (_extra_shard, "zero_pp_rank_1_mp_rank_00_optim_states.pt is not in "
                                  "manifest.json"),
    "pickle reaching os.system": (_exploit_shard, f"refusing to load {{ckpt}}/deepspeed/shards/"
                                                  f"{OPTIM}: Weights only load failed"),
}


@pytest.mark.parametrize("craft", list(CRAFTS))
def test_a_crafted_deepspeed_checkpoint_is_refused_by_consolidate_and_resume(
        tmp_path, marker, capsys, craft):
    pytest.importorskip("deepspeed")
    ckpt = _deepspeed_ckpt(tmp_path)
    assert verify.problem(ckpt) is None  # the uncrafted layout passes
    hurt, says = CRAFTS[craft]
    hurt(ckpt)
    says = says.format(root=tmp_path, ckpt=ckpt)
    assert says in verify.problem(ckpt)
    assert main(["checkpoint", "consolidate", str(ckpt)]) == 1
    assert says in capsys.readouterr().err
    with pytest.raises(checkpoint.CheckpointError, match="verifies"):
        checkpoint.resolve_resume("auto", tmp_path, say=lambda line: None)
    assert not marker.exists()


def test_crafted_replicated_checkpoints_are_refused(tmp_path, marker):
    """DDP's layout (HF weights, no shards): a linked weights file, a pickled one that runs code."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    torch.save({"step": 2, "run_id": "r"}, ckpt / checkpoint.STATE_FILE)
    save_file({"w": torch.zeros(1)}, tmp_path / "elsewhere.safetensors")
    (ckpt / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    verify.write_manifest(ckpt)
    assert "model.safetensors is a symbolic link to" in verify.problem(ckpt)
    (ckpt / "model.safetensors").unlink()
    torch.save({"w": _Exploit()}, ckpt / "pytorch_model.bin")
    verify.write_manifest(ckpt)
    assert f"refusing to load {ckpt}/pytorch_model.bin: Weights only load failed" in \
        verify.problem(ckpt)
    with pytest.raises(checkpoint.CheckpointError, match="pytorch_model.bin: Weights only"):
        checkpoint.resolve_resume("auto", run, say=lambda line: None)
    assert not marker.exists()


def test_crafted_dcp_checkpoints_are_refused(tmp_path, marker):
    linked = _dcp_ckpt(tmp_path / "linked", where=tmp_path / "evil_dcp")
    (linked / "dcp").symlink_to(tmp_path / "evil_dcp", target_is_directory=True)
    assert "dcp is a symbolic link to" in verify.problem(linked)
    with pytest.raises(checkpoint.CheckpointError, match="dcp is a symbolic link"):
        consolidate.full_state_dict(linked)
    # An item whose stored path leaves dcp/ (DCP opens `dcp/<relative_path>`)
    moved = _dcp_ckpt(tmp_path / "moved")
    meta_path = moved / "dcp" / ".metadata"
    meta = pickle.loads(meta_path.read_bytes())  # our own file: a plain read is safe here
    for info in meta.storage_data.values():
        info.relative_path = "../../../../outside.distcp"
    meta_path.write_bytes(pickle.dumps(meta))
    assert "is stored at ../../../../outside.distcp, outside" in verify.problem(moved)
    assert not marker.exists()


def _why(error: BaseException) -> str:
    """The message, also of what DCP wraps in a CheckpointException (one failure per rank)."""
    failures = getattr(error, "failures", {})
    return str(error) + "".join(str(getattr(f, "exception", f)) for f in failures.values())


def test_the_loaders_read_weights_only_even_past_the_check(tmp_path, marker):
    """What the engine and the consolidator call, handed a crafted file without verification."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    ckpt = _deepspeed_ckpt(tmp_path)
    with verify.only_weights():  # DeepSpeed's own records still load
        TorchCheckpointEngine().load(str(ckpt / "deepspeed" / "shards" / MODEL))
    for name in (MODEL, OPTIM):
        _exploit_file(ckpt / "deepspeed" / "shards" / name)
    with verify.only_weights(), pytest.raises(pickle.UnpicklingError):
        TorchCheckpointEngine().load(str(ckpt / "deepspeed" / "shards" / OPTIM))  # resume
    with pytest.raises(pickle.UnpicklingError):
        consolidate._from_zero(ckpt)  # zero_to_fp32, as `mmrl checkpoint consolidate` runs it
    assert torch.load.__module__ == "torch.serialization"  # restored on the way out
    dcp_ckpt = _dcp_ckpt(tmp_path / "dcp_run")
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.zeros(2)}, "extra": _Exploit()},
                 checkpoint_id=str(dcp_ckpt / "dcp"))
    with pytest.raises(BaseException) as refused:  # DCP raises a BaseException
        consolidate._from_dcp(dcp_ckpt)  # the planner's torch.load of the non-tensor item
    assert "Weights only load failed" in _why(refused.value)
    with (dcp_ckpt / "dcp" / ".metadata").open("wb") as f:
        pickle.dump({"state_dict_metadata": _Exploit()}, f)
    with pytest.raises(BaseException) as refused:  # DCP raises a BaseException
        consolidate._from_dcp(dcp_ckpt)  # torch's own reader would pickle.load it
    assert "it would build posix.system" in _why(refused.value)
    assert not marker.exists()


def test_a_real_dcp_checkpoint_consolidates_through_the_safe_reader(tmp_path):
    import torch.distributed.checkpoint as dcp

    ckpt = _dcp_ckpt(tmp_path)
    want = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    shutil.rmtree(ckpt / "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": want, "optimizer": {"lr": 0.5}}, checkpoint_id=str(ckpt / "dcp"))
    got = consolidate.full_state_dict(ckpt)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


# -- item 4: never a silent restart ---------------------------------------------------------------

def _intact(run_dir: Path, step: int) -> Path:
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    torch.save({"step": step, "run_id": "r"}, ckpt / checkpoint.STATE_FILE)
    save_file({"w": torch.zeros(1)}, ckpt / "model.safetensors")
    verify.write_manifest(ckpt)
    (run_dir / "checkpoints" / checkpoint.HELD).touch()  # as checkpoint.save leaves it
    return ckpt


def test_a_run_whose_checkpoints_all_fail_refuses_every_resume_auto(tmp_path):
    for step in (2, 4):
        (_intact(tmp_path, step) / checkpoint.STATE_FILE).write_bytes(b"")
    rows = "".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in range(1, 6))
    (tmp_path / "metrics.jsonl").write_text(rows)
    (tmp_path / "config.yaml").write_text("train:\n  run_id: r\n")
    auto = ["data.train=x.jsonl", f"log.run_dir={tmp_path}", "train.resume=auto"]
    with pytest.raises(checkpoint.CheckpointError, match="step_000004: trainer_state.pt is 0"):
        rundir.prepare(config.load(None, auto))  # the first try sets both aside
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == \
        ["step_000002.damaged", "step_000004.damaged"]
    for _ in range(2):  # as a requeue runs it, again and again
        with pytest.raises(checkpoint.CheckpointError,
                           match=r"set aside earlier: step_000002.damaged, step_000004.damaged"
                                 r"\); this run folder has held checkpoints"):
            rundir.prepare(config.load(None, auto))
    assert (tmp_path / "metrics.jsonl").read_text() == rows  # never cut back to step 0
    for damaged in (tmp_path / "checkpoints").glob("*.damaged"):  # the user clears them away
        shutil.rmtree(damaged)
    with pytest.raises(checkpoint.CheckpointError, match="none left"):
        rundir.prepare(config.load(None, auto))
    assert rundir.prepare(config.load(None, [*auto, "train.overwrite=true"])) is None
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    # A named checkpoint is the other way out; overwrite does not drop an intact one.
    good = _intact(tmp_path, 6)
    assert rundir.prepare(config.load(None, [*auto, "train.overwrite=true"])) == good


def test_save_marks_the_run_folder_as_having_held_checkpoints(tmp_path):
    from mmrl.models import get_adapter

    model, processor = get_adapter("qwen2_5_vl").tiny(min_pixels=3136, max_pixels=3136)
    assert checkpoint.resolve_resume("auto", tmp_path) is None  # nothing ever saved: fresh
    ckpt = checkpoint.save(tmp_path, 1, model, processor, {"run_id": "r"})
    assert (tmp_path / "checkpoints" / checkpoint.HELD).is_file()
    shutil.rmtree(ckpt)
    with pytest.raises(checkpoint.CheckpointError, match="has held checkpoints"):
        checkpoint.resolve_resume("auto", tmp_path)
