"""`mmrl validate` checks what `mmrl train` checks before building anything, the optional
packages a config needs included (wandb, vllm, deepspeed), and an override's error names the
override as typed."""
from __future__ import annotations

import importlib.util

import pytest

from mmrl import cli, validate

QUICKSTART = "recipes/quickstart.yaml"


@pytest.fixture
def missing(monkeypatch):
    """Pretend these packages are not installed (whatever this machine has)."""
    absent: set[str] = set()
    real = importlib.util.find_spec
    monkeypatch.setattr(validate.importlib.util, "find_spec",
                        lambda name, *a: None if name in absent else real(name, *a))
    return absent


@pytest.mark.parametrize("overrides, package, line", [
    (["log.wandb=true"], "wandb", "log.wandb=true needs wandb, which is not installed: "
                                  "pip install 'mmrl[wandb]'"),
    (["rollout.backend=vllm"], "vllm", "rollout.backend=vllm (colocated) needs vllm, which is "
                                       "not installed: on a GPU pip install 'mmrl[gpu]'"),
    (["train.parallel=deepspeed", "sft.steps=0"], "deepspeed",
     "train.parallel=deepspeed (resolved: deepspeed) needs deepspeed, which is not installed"),
])
def test_validate_and_train_name_a_missing_optional_package(missing, capsys, overrides, package,
                                                            line):
    missing.add(package)
    assert cli.main(["validate", QUICKSTART, *overrides]) == 1
    captured = capsys.readouterr()
    assert f"{QUICKSTART}: {line}" in captured.err
    assert captured.out.strip() == f"{QUICKSTART}: 1 problem(s)"
    with pytest.raises(SystemExit) as e:  # train stops on the same line, before any model
        cli.main(["train", QUICKSTART, *overrides])
    assert str(e.value).startswith(f"config error: {line}")


def test_what_needs_no_optional_package_passes(missing, monkeypatch):
    from mmrl import config

    missing.update({"wandb", "vllm", "deepspeed"})
    assert validate.missing_packages(config.load(QUICKSTART)) == []
    # A vLLM server fed weights over HTTP: the trainer's process imports nothing of vLLM.
    server = config.load(QUICKSTART, ["rollout.backend=vllm",
                                      "rollout.vllm.server_url=http://localhost:8000"])
    assert validate.missing_packages(server) == []
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # auto, under accelerate's ZeRO config
    assert "needs deepspeed" in validate.missing_packages(config.load(QUICKSTART))[0]


@pytest.mark.parametrize("override, message", [
    ("train.lr=abc", "Value 'abc' of type 'str' could not be converted to Float"),
    ("train.lr=-1", "train.lr=-1.0: must be > 0"),
    ("train.lrr=1", "Key 'lrr' not in 'TrainConfig'"),
])
def test_an_override_error_names_the_override_not_the_yaml(capsys, override, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", QUICKSTART, override])
    assert str(e.value).startswith(f"config error: override {override}: {message}"), str(e.value)


def test_validate_checks_the_process_count_that_world_size_names(monkeypatch, capsys):
    """docs/scale-out.md's `WORLD_SIZE=8 mmrl validate ... long.yaml`: SP 4 x 2 data-parallel
    ranks is legal on 8 processes and not on one."""
    args = ["validate", "recipes/video_qa/config.yaml", "recipes/video_qa/long.yaml"]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match="train.sequence_parallel=4: must divide the process "
                                         "count 1"):
        cli.main(args)
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert cli.main(args) == 0  # the load and every later rule read the same 8
    assert capsys.readouterr().out.strip() == "recipes/video_qa/config.yaml: OK"
