"""The trainer's parts keep their insides to themselves. Each part class names what other files
may read of it (its `PUBLIC` tuple); reading any other member of a part outside its own class is
the coupling the split into parts removed, and fails here.

Checked from the source with `ast`, simply: a name holds a part when it is a parameter annotated
with the part's class, a local assigned from a part-typed expression, or an attribute that a class
set from such a parameter or from the part's constructor (`self.policy = Policy(...)`); attribute
chains follow those (`trainer.policy.model`). Anything the check cannot type it does not judge.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
# A parameter with one of these names holds a part (or the strategy / model adapter the parts are
# built from) and must say which, so that readers and this check see the coupling.
PART_PARAMS = {"policy", "learner", "rollout", "scorer", "checkpointer", "trainer", "strategy",
               "adapter"}


def _sources() -> dict[str, ast.Module]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(), str(p))
            for p in sorted((ROOT / "mmrl").rglob("*.py"))}


def public_lists(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Part class name -> the names it declares public (`PUBLIC = (...)` in the class body)."""
    out = {}
    for tree in trees.values():
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for stmt in cls.body:
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and getattr(stmt.targets[0], "id", None) == "PUBLIC"):
                    out[cls.name] = set(ast.literal_eval(stmt.value))
    return out


def _annotated_part(node, parts) -> str | None:
    """The part class an annotation names (`Policy`, `"Policy"`, `Policy | None`, `mod.Policy`)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _annotated_part(ast.parse(node.value, mode="eval").body, parts)
    if isinstance(node, ast.BinOp):
        return _annotated_part(node.left, parts) or _annotated_part(node.right, parts)
    name = getattr(node, "id", None) or getattr(node, "attr", None)
    return name if name in parts else None


def _pairs(target, value):
    """(target, value) pairs of an assignment, tuple targets matched element by element."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
            and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _pairs(t, v)
    else:
        yield target, value


def _functions(tree):
    """(enclosing class name or None, function node) for every function."""
    def visit(node, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield cls, child
                yield from visit(child, cls)
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, child.name)
            else:
                yield from visit(child, cls)
    yield from visit(tree, None)


class Types:
    """What the check knows: part classes, their public names and the parts their attributes
    hold (`Trainer.policy` -> Policy, `Learner.policy` -> Policy)."""

    def __init__(self, trees: dict[str, ast.Module]):
        self.public = public_lists(trees)
        self.attrs: dict[str, dict[str, str]] = {}  # class -> attribute -> part
        for tree in trees.values():
            for cls, fn in _functions(tree):
                if cls is None:
                    continue
                params = self.params(fn)
                for node in ast.walk(fn):
                    if not isinstance(node, ast.Assign):
                        continue
                    for target, value in (p for t in node.targets for p in _pairs(t, node.value)):
                        if (isinstance(target, ast.Attribute)
                                and getattr(target.value, "id", None) == "self"):
                            part = self.of(value, params, cls)
                            if part:
                                self.attrs.setdefault(cls, {})[target.attr] = part

    def params(self, fn) -> dict[str, str]:
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        return {a.arg: p for a in args if (p := _annotated_part(a.annotation, self.public))}

    def of(self, node, local: dict[str, str], cls: str | None) -> str | None:
        """The part an expression holds, if the check can tell."""
        if isinstance(node, ast.Name):
            return local.get(node.id)
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            return name if name in self.public else None
        if isinstance(node, ast.Attribute):
            owner = cls if getattr(node.value, "id", None) == "self" else \
                self.of(node.value, local, cls)
            return self.attrs.get(owner, {}).get(node.attr) if owner else None
        return None

    def locals(self, fn, cls: str | None) -> dict[str, str]:
        local = self.params(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for target, value in (p for t in node.targets for p in _pairs(t, node.value)):
                    part = self.of(value, local, cls)
                    if isinstance(target, ast.Name) and part:
                        local[target.id] = part
        return local


def private_reads(trees: dict[str, ast.Module]) -> list[str]:
    """`file:line reads Part.member` for every member read outside the part's public list."""
    types, found = Types(trees), []
    for rel, tree in trees.items():
        for cls, fn in _functions(tree):
            local = types.locals(fn, cls)
            for node in ast.walk(fn):
                if not isinstance(node, ast.Attribute):
                    continue
                own = cls is not None and getattr(node.value, "id", None) == "self"
                part = None if own else types.of(node.value, local, cls)
                if part and part != cls and node.attr not in types.public[part]:
                    found.append(f"{rel}:{node.lineno} reads {part}.{node.attr}")
    return sorted(set(found))


def test_the_check_sees_a_private_read_and_passes_a_public_one():
    trees = {"a.py": ast.parse(
        "class Policy:\n    PUBLIC = ('model',)\n"
        "class Learner:\n    PUBLIC = ('policy',)\n"
        "    def __init__(self, policy: Policy):\n        self.policy = policy\n"
        "class Trainer:\n    PUBLIC = ('learner',)\n"
        "    def __init__(self, cfg):\n        self.learner = Learner(cfg)\n"
        "def f(t: Trainer, p: 'Policy | None'):\n"
        "    q = t.learner.policy\n"
        "    return t.learner.policy.model, q.device, p.model, p.pad_id, t.step\n")}
    assert private_reads(trees) == ["a.py:13 reads Policy.device", "a.py:13 reads Policy.pad_id",
                                    "a.py:13 reads Trainer.step"]


def test_no_file_reads_a_part_member_outside_its_public_list():
    assert private_reads(_sources()) == []


def reads_of(trees: dict[str, ast.Module], part: str) -> set[str]:
    """The members of `part` that files other than its own class read."""
    types, found = Types(trees), set()
    for rel, tree in trees.items():
        for cls, fn in _functions(tree):
            local = types.locals(fn, cls)
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and cls != part and not (
                        cls is not None and getattr(node.value, "id", None) == "self"):
                    if types.of(node.value, local, cls) == part:
                        found.add(node.attr)
    return found


def test_the_policys_surface_is_what_other_files_read_and_at_most_15_names():
    """#58: the Policy was the hub (24 public names, 10 read by no product file)."""
    trees = _sources()
    public = public_lists(trees)["Policy"]
    assert public == reads_of(trees, "Policy") and len(public) <= 15


def test_every_part_declares_its_public_names():
    assert {"Policy", "Learner", "Rollout", "Scorer", "PromptSource", "Checkpointer",
            "Trainer"} <= set(public_lists(_sources()))


def test_every_part_parameter_in_train_says_its_type():
    missing = []
    for rel, tree in _sources().items():
        if not rel.startswith("mmrl/train/"):
            continue
        for _, fn in _functions(tree):
            for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
                if a.arg in PART_PARAMS and a.annotation is None:
                    missing.append(f"{rel}:{fn.lineno} {fn.name}({a.arg})")
    assert missing == []


def test_only_the_loop_and_the_checkpointer_hold_the_learner():
    holders = set()
    for rel, tree in _sources().items():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.arg):
                names = [node.annotation]
            elif isinstance(node, ast.Call):
                names = [node.func]
            if any(_annotated_part(n, {"Learner"}) for n in names):
                holders.add(rel)
    assert holders == {"mmrl/train/loop.py", "mmrl/train/checkpointer.py"}
