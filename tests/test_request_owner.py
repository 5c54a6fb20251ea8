"""One owner for a request's life, and protocols that are declared, not probed: checked on the source.

The scheduler builds every Request (BatchEngine.submit) and ends every one (BatchEngine._end, the one caller of
close_request); the drafter and backend capabilities the core uses are declared on their contracts
(drafters/base.py, models/backend.py), so the core never probes a drafter or a backend with getattr; and which
drafter drafts is an explicit DrafterChoice, with no None/"default" sentinels."""
import ast
import re
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent
CORE = ("engine.py", "scheduler.py", "drafting.py", "request.py", "request_prefix.py", "policy.py")


def _sources():
    return {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8") for path in ROOT.rglob("*.py")}


def _calls(source: str, name: str) -> list[ast.Call]:
    """Calls of `name` (a plain name or an attribute) in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called == name:
                found.append(node)
    return found


def test_a_request_is_built_and_closed_in_the_scheduler_only():
    built = {path: len(_calls(text, "Request")) for path, text in _sources().items()}
    assert {path for path, n in built.items() if n} == {"scheduler.py"} and built["scheduler.py"] == 1, built
    closed = {path: len(_calls(text, "close_request")) for path, text in _sources().items()}
    assert {path for path, n in closed.items() if n} == {"scheduler.py"} and closed["scheduler.py"] == 1, closed


def test_the_core_never_probes_a_drafter_or_a_backend():
    bad = []
    for path, text in _sources().items():
        for call in _calls(text, "getattr") + _calls(text, "hasattr"):
            subject = ast.unparse(call.args[0]) if call.args else ""
            probed = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
            if path in CORE and re.search(r"drafter|backend|target", subject):
                bad.append((path, ast.unparse(call)))
            if path.startswith("drafters/") and subject == "self" and "request" in probed:
                bad.append((path, ast.unparse(call)))  # Drafter.request is declared
            if re.search(r"pass_sharing|propose_together|prefix_cache|copy_cache", probed):
                bad.append((path, ast.unparse(call)))  # declared on the drafter and backend contracts
    assert not bad, bad


def test_no_sentinel_stands_for_a_drafter_choice():
    sources = _sources()
    for path in ("engine.py", "scheduler.py", "server/worker.py", "lossless.py"):
        assert '"default"' not in sources[path], path
    scheduler = ast.parse(sources["scheduler.py"])
    submit = next(n for n in ast.walk(scheduler) if isinstance(n, ast.FunctionDef) and n.name == "submit")
    assert "DrafterChoice" in ast.unparse(submit.args)  # the scheduler takes an explicit choice


def test_the_contracts_declare_what_the_scheduler_uses():
    from specdec.drafters.base import Drafter
    from specdec.models.backend import CausalLM

    for name in ("begin", "propose", "observe", "scored", "learn", "end", "fork", "pass_sharing",
                 "propose_together", "request", "feature_layers", "needs_scores", "sizing"):
        assert hasattr(Drafter, name), name
    for name in ("prefix_cache", "copies_caches", "enable_prefix_cache", "copy_cache", "new_cache", "release",
                 "forward", "forward_batch", "truncate", "compact"):
        assert hasattr(CausalLM, name), name
