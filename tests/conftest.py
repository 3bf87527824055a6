"""Test-wide settings: offline always (nothing downloads), few threads, no denormal slow-downs."""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# DeepSpeed's CPU ops (cpu_adam, shm_comm) are JIT-built once per install, in its own folder: a
# build killed in another checkout's run can leave a lock there that nothing here waits on.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))

import torch  # noqa: E402  (after the environment: transformers reads it at import)

# Under pytest-xdist (pyproject's `-n 2`) the cores are shared among the workers: each worker's
# torch, and the processes its tests start, take their share, not all of them each.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
torch.set_num_threads(_THREADS)
# Denormal floats caused 10-20x step-time spikes in tiny-model training on CPU.
torch.set_flush_denormal(True)


# ---- The tiny trainer: one config and one set of user rewards for every test that trains ----

import copy  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

# A random tiny model never writes the answer format, so `accuracy` or `format` give every group
# the same score and nothing to learn from. These rewards vary with the completion's characters,
# so random completions get non-zero advantages. Loaded through the "module:function" escape
# hatch, as a user's own rewards are: 'mmrl_test_rewards:char_variety'.
USER_REWARDS = '''
def char_variety(completions, solution, **fields):
    return [len(set(c)) / 10 for c in completions]
def odd_variety(completions, solution, **fields):  # even counts: constant 0, no signal
    return [len(set(c)) / 10 if int(s) % 2 else 0.0 for c, s in zip(completions, solution)]
def variety_above_two(completions, solution, **fields):  # counts 1 and 2: constant 0
    return [0.0 if s in ("1", "2") else len(set(c)) / 10 for c, s in zip(completions, solution)]
def nan_reward(completions, solution, **fields):
    return [float("nan")] * len(completions)
def string_reward(completions, solution, **fields):
    return ["1.0"] * len(completions)
'''

# Two GRPO steps of 2 prompts x 4 completions on a tiny Qwen2.5-VL, on 56 px counting images
# (4 visual tokens) that `data.generate` writes at the first run. "{data}" is the data folder.
TINY_TRAINER = {
    "name": "tiny",
    "data": {"train": "{data}/train.jsonl", "generate": "counting",
             "generate_kwargs": {"n_train": 32, "n_eval": 4}},
    "model": {"family": "qwen2_5_vl", "path": "tiny",
              "tiny": {"min_pixels": 3136, "max_pixels": 3136}},
    "rollout": {"prompts_per_step": 2, "num_generations": 4, "max_new_tokens": 6},
    "rewards": [{"name": "mmrl_test_rewards:char_variety"}],
    "train": {"steps": 2, "lr": 1.0e-3, "micro_batch_size": 8},
    "eval": {"before_rl": False},
    "log": {"progress": "off", "tensorboard": False, "rollouts_every": 0},
}


@pytest.fixture(scope="session")
def user_rewards(tmp_path_factory) -> Path:
    """The folder holding mmrl_test_rewards.py, on sys.path for runs in this process; put it on
    PYTHONPATH for runs in subprocesses."""
    root = tmp_path_factory.mktemp("user_rewards")
    (root / "mmrl_test_rewards.py").write_text(USER_REWARDS)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def _merge(base: dict, delta: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture(scope="session")
def tiny_config(user_rewards):
    """write(path, data_dir, **sections) -> path: TINY_TRAINER with each section updated key by
    key (`rewards` is replaced whole), "{data}" -> data_dir."""
    def write(path: Path, data_dir: Path, /, **sections) -> Path:
        cfg = _merge(TINY_TRAINER, sections)
        text = yaml.safe_dump(cfg, sort_keys=False).replace("{data}", str(data_dir))
        path.write_text(text)
        return path
    return write


# ---- Longest files first under pytest-xdist ----
# `--dist loadfile` hands out whole files; pyproject's `--no-loadscope-reorder` keeps them in
# collection order instead of most-tests-first, which put the one-test visual_search row (~14
# min) last and left the other worker idle for its whole run. These start first, the rest follow.
LONGEST_FIRST = ("tests/integration/test_learning_search.py", "tests/integration/test_learning.py",
                 "tests/integration/test_sharded.py", "tests/integration/test_recipes.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        return next((i for i, f in enumerate(LONGEST_FIRST) if item.nodeid.startswith(f)),
                    len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: every other file keeps its order
