"""The one-way import flow, checked from the source: no import cycles in `mmrl` or `rewards`
(module-level and function-level imports both count: a lazy import still ties two modules
together), and `mmrl.algos` imports only torch, the standard library and this repo's modules that
themselves import only the standard library (the "pkg.mod:attr" loader, mmrl/loader.py)."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("mmrl", "rewards")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[str]:
    """Every module `name` imports (absolute names, third-party ones included)."""
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the containing package upwards
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for alias in node.names:  # `from pkg import mod` imports the submodule
                sub = f"{base}.{alias.name}"
                found.append(sub if sub in MODULES else base)
    return found


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for imported in _imports(name, path):
            while imported and imported not in MODULES:  # mmrl.x.y.attr -> the module mmrl.x.y
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_real_imports():
    graph = _graph()
    assert "mmrl.data.schema" in graph["mmrl.data.formats"]  # from-import of a module
    assert "mmrl.data.media" in graph["mmrl.data.cache"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_rewards_imports_nothing_from_mmrl():
    graph = _graph()
    bad = {m: sorted(t for t in ts if t.startswith("mmrl"))
           for m, ts in graph.items() if m.startswith("rewards")}
    assert {m: ts for m, ts in bad.items() if ts} == {}


STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _stdlib_leaves() -> set[str]:
    """Modules of this repo that import only the standard library (e.g. mmrl.loader)."""
    return {name for name, path in MODULES.items()
            if all(i.split(".")[0] in STDLIB for i in _imports(name, path))}


def _algos_outside_imports() -> dict[str, list[str]]:
    allowed = STDLIB | {"torch"}
    leaves = _stdlib_leaves()
    bad = {}
    for name, path in MODULES.items():
        if name == "mmrl.algos" or name.startswith("mmrl.algos."):
            outside = sorted({i for i in _imports(name, path)
                              if i.split(".")[0] not in allowed and not i.startswith("mmrl.algos")
                              and i != "mmrl" and i not in leaves})
            if outside:
                bad[name] = outside
    return bad


def test_algos_import_only_torch_the_standard_library_and_stdlib_only_leaves():
    assert "mmrl.loader" in _stdlib_leaves() and "mmrl.registry" not in _stdlib_leaves()
    assert _algos_outside_imports() == {}


def test_the_plan_imports_nothing_from_the_benchmarks():
    """`mmrl plan` and the memory check are user-facing and run before training: they predict,
    mmrl/bench measures. The benchmarks may use the plan (the GPU check compares it to a
    measured peak), never the other way."""
    graph = _graph()
    plan = {m: ts for m, ts in graph.items() if m == "mmrl.plan" or m.startswith("mmrl.plan.")}
    assert "mmrl.plan.memory" in plan and "mmrl.plan.fit" in plan
    assert {m: sorted(t for t in ts if t.startswith("mmrl.bench"))
            for m, ts in plan.items() if any(t.startswith("mmrl.bench") for t in ts)} == {}


def test_no_private_names_imported_across_modules_in_data_and_rollout():
    """A `_private` helper used by another module is a shared helper: make it public where it
    belongs (e.g. rollout/vllm_io.py) instead of reaching into a sibling."""
    bad = []
    for name, path in MODULES.items():
        if not name.startswith(("mmrl.data", "mmrl.rollout", "mmrl.plan")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmrl"):
                bad += [f"{name}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


def test_the_product_imports_nothing_from_research():
    """research/ (the learning table, its probes) uses the product; the product (mmrl/, rewards/,
    scripts/) never uses it: not as `research.x`, and not as a bare module name found there
    through sys.path."""
    names = {"research"} | {p.stem for p in (ROOT / "research").rglob("*.py")}
    product = dict(MODULES)
    product.update({f"scripts.{p.stem}": p for p in (ROOT / "scripts").rglob("*.py")})
    bad = {m: sorted(i for i in _imports(m, p) if i.split(".")[0] in names)
           for m, p in product.items()}
    assert {m: i for m, i in bad.items() if i} == {}


def test_envs_import_only_the_types_and_the_registry():
    """DESIGN.md's arrow `mmrl/envs -> types, registry`: the Environment contract knows no
    engine, model, tool or device, so a user environment depends on nothing heavier. The
    built-in environments (grid_nav) are modules of the package and follow the same rule."""
    graph = _graph()
    allowed = {"mmrl.types", "mmrl.registry", "mmrl.loader", "mmrl.envs"}
    found = {name: sorted(t for t in targets if t.startswith(("mmrl.", "rewards")) and
                          t not in allowed and not t.startswith("mmrl.envs."))
             for name, targets in graph.items() if name.startswith("mmrl.envs")}
    assert found and all(not v for v in found.values()), found
