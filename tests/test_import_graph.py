"""The layers of specdec's code: a lower layer never imports a higher one, and no import cycle, however indirect.

Layers, lowest first (LAYERS): the base (errors, files, tokens, config); the CPU kernels; the model backends; the
core (engine, scheduler, drafters, verification, sampling, ...); training; the tools (benchmarks); then the front ends
(cli, server) and the package's lazy facade, `specdec` itself. Every import counts, those inside functions too: an
import deferred into a function still ties the two modules together. Within the core, the roles stay apart:
verification is pure (it knows no model, drafter or request), the draft-length policy knows no request, a request
never reaches a model or the scheduler, and drafters know nothing of the loop that runs them.
"""
import ast
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent
# lowest first; a module's layer is its first name under specdec (a subpackage or a top-level module), "core" if
# not listed, and the package's __init__ ("") is the facade front ends and users import
LAYERS = [
    {"errors", "files", "tokens", "config"},
    {"kernels"},
    {"models"},
    {"core"},
    {"training"},
    {"benchmarks"},
    {"cli", "server", ""},
]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name (a package by its own name) -> its file."""
    out = {}
    for path in root.rglob("*.py"):
        parts = (root.name,) + path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(root: Path = ROOT, module_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports. `from a import b` imports the module a.b when there is one,
    else a; an import of a name that is no module resolves to the nearest module above it."""
    files = modules(root)
    out = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = set()
        for node in tree.body if module_level_only else ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = {f"{target}.{a.name}" for a in node.names} & files.keys()
                found |= submodules
                if len(submodules) < len(node.names):
                    found.add(target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        targets = set()
        for target in found:
            if target == root.name or target.startswith(root.name + "."):
                while target not in files:
                    target = target.rsplit(".", 1)[0]
                targets.add(target)
        out[name] = targets - {name}
    return out


def layer(module: str) -> int:
    """The index in LAYERS of a module's layer."""
    first = module.split(".")[1] if "." in module else ""
    return next((i for i, names in enumerate(LAYERS) if first in names),
                next(i for i, names in enumerate(LAYERS) if "core" in names))


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((module, target) for module, targets in graph.items() for target in targets
                  if layer(target) > layer(module))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None when the graph has none (depth-first, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(target) == 1:
                return path[path.index(target):] + [target]
            elif not state.get(target) and target in graph:
                state[target] = 1
                path.append(target)
                stack.append(iter(sorted(graph[target])))
    return None


def test_lower_layers_never_import_higher_ones():
    assert not upward_imports(imports()), upward_imports(imports())


def test_no_import_cycle_among_specdec_modules():
    cycle = find_cycle(imports())
    assert cycle is None, " -> ".join(cycle)


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    """The two checks above on a made-up package: a cycle through a function-level import and a package's
    re-export, and a kernel module that reaches up into the models."""
    package = tmp_path / "specdec"
    (package / "verify").mkdir(parents=True)
    (package / "kernels").mkdir()
    (package / "models").mkdir()
    (package / "models" / "registry.py").write_text("def cache_root():\n    pass\n")
    (package / "__init__.py").write_text("")
    (package / "verify" / "__init__.py").write_text("from .tree import walk\n\ndef greedy():\n    pass\n")
    (package / "verify" / "tree.py").write_text("def walk():\n    from . import greedy\n")
    (package / "kernels" / "__init__.py").write_text("def build():\n    from ..models.registry import cache_root\n")
    graph = imports(package)
    assert find_cycle(graph) == ["specdec.verify", "specdec.verify.tree", "specdec.verify"]
    assert find_cycle(imports(package, module_level_only=True)) is None  # the function-level import is the cycle
    assert upward_imports(graph) == [("specdec.kernels", "specdec.models.registry")]


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


def test_the_drafters_rooms_keep_apart():
    """drafters/ holds the registry (its __init__) and the drafters' basics (base, options, trees) at its top, and
    the drafters in rooms: lookup, models, heads and routing. A room's modules import the basics and their own room,
    of the other rooms only what is listed (the quantized copy drafts with prompt lookup riding along), and never
    the registry, which imports them all."""
    allowed = {"lookup": set(), "models": {"lookup"}, "heads": set(), "routing": {"lookup", "models", "heads"}}
    graph = imports()
    rooms = {name.split(".")[2] for name in graph if name.startswith("specdec.drafters.") and name.count(".") >= 3}
    assert rooms == set(allowed)
    assert len(list((ROOT / "drafters").glob("*.py"))) <= 8
    for module, targets in graph.items():
        parts = module.split(".")
        if parts[:2] != ["specdec", "drafters"] or len(parts) < 4:
            continue
        for target in targets:
            target_parts = target.split(".")
            if target_parts[:2] != ["specdec", "drafters"]:
                continue
            assert target != "specdec.drafters", (module, "imports the registry")
            if len(target_parts) >= 4 and target_parts[2] != parts[2]:
                assert target_parts[2] in allowed[parts[2]], (module, target)
