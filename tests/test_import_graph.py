"""The layers of specdec's code: a lower layer never imports a higher one, and module-level imports have no cycle.

Layers, lowest first: the model backends and kernels; the core (engine, drafters, verification, sampling, ...);
training; the tools (bench); then the front ends (cli, server). Every import counts, those inside functions too.
Within the core, the roles stay apart: verification is pure (it knows no model, drafter or request), the
draft-length policy knows no request, a request never reaches a model or the scheduler, and drafters know nothing
of the loop that runs them.
"""
import ast
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent
FRONT = {"cli", "server"}
TOOLS = {"bench"}
LOW = {"models", "kernels", "errors", "files", "tokens", "config"}


def imports(module_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the specdec modules it imports."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("specdec",) + path.relative_to(ROOT).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        package = name if is_package else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = tree.body if module_level_only else ast.walk(tree)
        found = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[name] = {t for t in found if t == "specdec" or t.startswith("specdec.")}
    return out


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_lower_layers_never_import_higher_ones():
    bad = []
    for module, targets in imports().items():
        here = layer(module)
        for target in targets:
            there = layer(target)
            if here in ("models", "kernels") and there not in LOW:
                bad.append((module, target))  # the backends know nothing of drafters, engines or tools
            elif here not in FRONT | TOOLS | {"training", ""} and there in FRONT | TOOLS | {"training"}:
                bad.append((module, target))  # the core never imports training, tools or front ends
            elif here in TOOLS | {"training"} and there in FRONT:
                bad.append((module, target))
    assert not bad, bad


# module (or package) -> the specdec modules it must never import, itself or through its submodules
ROLES = {
    "specdec.verify": ("specdec.models", "specdec.drafters", "specdec.request", "specdec.scheduler", "specdec.engine",
                       "specdec.policy", "specdec.logits"),
    "specdec.policy": ("specdec.drafters", "specdec.request", "specdec.scheduler", "specdec.engine"),
    "specdec.costs": ("specdec.models", "specdec.drafters", "specdec.request", "specdec.scheduler", "specdec.engine",
                      "specdec.policy", "specdec.verify"),
    "specdec.logits": ("specdec.models", "specdec.drafters", "specdec.request", "specdec.scheduler", "specdec.engine"),
    "specdec.request": ("specdec.models", "specdec.scheduler", "specdec.engine"),
    "specdec.scheduler": ("specdec.engine",),
    "specdec.drafters": ("specdec.request", "specdec.scheduler", "specdec.engine"),
}


def test_the_core_roles_stay_apart():
    bad = []
    for module, targets in imports().items():
        for role, forbidden in ROLES.items():
            if module == role or module.startswith(role + "."):
                bad += [(module, t) for t in targets if any(t == f or t.startswith(f + ".") for f in forbidden)]
    assert not bad, bad


def test_module_level_imports_have_no_cycle():
    graph = imports(module_level_only=True)
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            target = target if target in graph else target.rsplit(".", 1)[0]
            if state.get(target) == 1:
                return path + [target]
            if target in graph and not state.get(target):
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if not state.get(module):
            cycle = visit(module, [module])
            assert cycle is None, " -> ".join(cycle)
