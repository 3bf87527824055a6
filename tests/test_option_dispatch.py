"""Option values are compared in one place: mmrl/config.py and mmrl/config_rules.py validate
and resolve them; everywhere else the code dispatches on them through a table keyed by the option
or reads a capability attribute of the part it holds. Checked from the source: no `==`, `!=`,
`in`, `not in` against a string that is one of the legal values of an option (the `Literal`
types of the config dataclasses) outside those two files."""
from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from mmrl import config

ROOT = Path(__file__).parents[1]
VALIDATION_HOME = {"mmrl/config.py", "mmrl/config_algo.py", "mmrl/config_env.py",
                   "mmrl/config_rules.py"}

# (module, enclosing function, string): why that comparison is not one of an mmrl option.
NOT_OPTIONS = {
    ("mmrl/train/parallel.py", "deepspeed_config", "auto"): "DeepSpeed's JSON placeholder 'fill in'",
    ("mmrl/train/parallel.py", "_fill_auto", "auto"): "DeepSpeed's JSON placeholder 'fill in'",
    ("mmrl/train/parallel.py", "deepspeed_config", "none"): "accelerate's offload-device variable",
}


def _literal_values(tp) -> set[str]:
    if typing.get_origin(tp) is typing.Literal:
        return {a for a in typing.get_args(tp) if isinstance(a, str)}
    return set().union(*(_literal_values(a) for a in typing.get_args(tp)))


def option_values() -> set[str]:
    """Every legal value of every Literal-typed field of RunConfig and its nested dataclasses."""
    values, todo, seen = set(), [config.RunConfig], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            values |= _literal_values(tp)
            todo += [t for t in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(t)]
    return values


def _strings(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def _compares(tree: ast.AST):
    """(enclosing function, string constant, line) of every string in a comparison."""
    def visit(node, where):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            where = f"{where}.{node.name}" if where else node.name
        if isinstance(node, ast.Compare) and all(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            for side in (node.left, *node.comparators):
                for s in _strings(side):
                    yield where, s, node.lineno
        for child in ast.iter_child_nodes(node):
            yield from visit(child, where)
    yield from visit(tree, "")


def option_compares(values: set[str]) -> list[str]:
    found = []
    for path in sorted((ROOT / "mmrl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in VALIDATION_HOME:
            continue
        for where, s, line in _compares(ast.parse(path.read_text(), rel)):
            if s in values and (rel, where, s) not in NOT_OPTIONS:
                found.append(f"{rel}:{line} ({where}) compares {s!r}")
    return found


def test_option_values_come_from_the_literal_types():
    values = option_values()
    assert {"hf", "vllm", "token_mean", "skip", "auto", "off", "k3", "fsdp2"} <= values
    assert "qwen2_5_vl" not in values  # model.family is a str (a registry name), not a Literal


def test_the_check_sees_a_string_branch():
    tree = ast.parse("def f(cfg):\n    if cfg.rollout.backend == 'hf' or x in ('a', 'vllm'):\n"
                     "        pass\n")
    assert [(w, s) for w, s, _ in _compares(tree)] == [("f", "hf"), ("f", "a"), ("f", "vllm")]


def test_no_option_value_compared_outside_the_config():
    assert option_compares(option_values()) == []


def test_every_allowlisted_comparison_still_exists():
    values = option_values()
    seen = set()
    for path in sorted((ROOT / "mmrl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        seen |= {(rel, w, s) for w, s, _ in _compares(ast.parse(path.read_text())) if s in values}
    assert set(NOT_OPTIONS) - seen == set()


def test_every_dispatch_table_covers_its_option():
    """A value added to a Literal without its entry in the table would fail only when used."""
    from mmrl import algos
    from mmrl.data import audio
    from mmrl.rollout import base
    from mmrl.train import checkpoint, logging, optim, parallel, policy

    c = config.choices
    assert set(base.ENGINES) == set(c(config.Backend))
    assert set(optim.LR_SCHEDULES) == set(c(config.LRSchedule))
    assert set(policy.DTYPES) == set(c(config.DType))
    assert set(audio.AUDIO_KEEPS_HEAD) == set(c(config.AudioTruncate))
    assert set(parallel.STRATEGY_CLASSES) | {"auto"} == set(c(config.Parallel))
    assert set(logging.PROGRESS_SHOWS) | {"auto"} == set(c(config.Progress)) | {"silent"}
    assert {"none", "auto"} <= set(checkpoint.RESUME_KEYWORDS)
    assert tuple(algos.LOSS_TYPES) == c(config.LossType)
    assert tuple(algos.RATIO_LEVELS) == c(config.Ratio)


def test_lr_schedules_hand_computed():
    import torch

    from mmrl.train.optim import lr_schedule

    def factors(kind):
        tc = config.TrainConfig(lr=1.0, lr_schedule=kind, warmup_steps=2)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = lr_schedule(opt, tc, total_steps=6)
        return [round(f(step), 6) for step in range(7) for f in sched.lr_lambdas]

    # warm-up (step + 1) / 2, then progress p = (step - 2) / 4
    assert factors("constant") == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert factors("linear") == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert factors("cosine") == [0.5, 1.0, 1.0, 0.853553, 0.5, 0.146447, 0.0]


def test_progress_modes_show_what_they_say(tmp_path, capsys):
    from mmrl.train.logging import RunLogger

    shown = {}
    for mode in ("lines", "off", "silent"):
        log = RunLogger(tmp_path / mode, tensorboard=False, progress=mode, log_every=1)
        log.print("hello")
        log.log(1, {"loss": 0.5}, total=2)
        log.close()
        shown[mode] = capsys.readouterr().err
    assert "hello" in shown["lines"] and "step 1/2" in shown["lines"]
    assert "hello" in shown["off"] and "step" not in shown["off"]
    assert shown["silent"] == ""
