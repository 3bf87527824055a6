"""lmms-eval's own task files, loaded offline as the parity reference of the benchmark tests.

`lmms_eval/tasks/__init__.py` builds lmms-eval's whole task registry on import (accelerate,
evaluate, tenacity and the rest of its stack, none of which a task's scorer uses), so the tasks
package is entered as a plain namespace on its real folder: each task's utils.py runs unchanged.
Installed by scripts/setup.sh with --no-deps (its requirements pin wandb and pull yt-dlp, openai,
...); without it the parity tests skip and say so."""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

VERSION = "0.7.3"


def task_module(dotted: str):
    """`lmms_eval.tasks.<dotted>`, e.g. "refcoco.utils_rec", or a skip naming what is missing."""
    try:
        import lmms_eval
    except ImportError:
        pytest.skip(f"lmms-eval {VERSION} is not installed (scripts/setup.sh installs it)")
    if "lmms_eval.tasks" not in sys.modules:
        tasks = types.ModuleType("lmms_eval.tasks")
        tasks.__path__ = [str(Path(lmms_eval.__file__).parent / "tasks")]
        sys.modules["lmms_eval.tasks"] = tasks
    try:
        return importlib.import_module(f"lmms_eval.tasks.{dotted}")
    except ImportError as e:  # a task whose file needs more than the stack has
        pytest.skip(f"lmms_eval.tasks.{dotted} does not import offline here: {e}")
