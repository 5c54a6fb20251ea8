"""README.md is a user's guide: short, with the two commands a new user runs, every registered drafter, and no
development history (that lives in docs/experiments/)."""
import re
from pathlib import Path

from specdec.drafters import drafter_names

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
INSTALL = ('python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints-cpu.txt ".[dev]" && '
           'specdec generate "Explain speculative decoding in two sentences." --stats')
TESTS = ". .venv/bin/activate && python -m pytest -q"


def test_the_two_commands_come_first():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    assert blocks[:2] == [INSTALL, TESTS]


def test_at_most_300_lines():
    assert len(README.splitlines()) <= 300


def test_every_registered_drafter_has_a_row_in_the_drafter_table():
    table = README.split("## Drafters", 1)[1].split("\n## ", 1)[0]
    rows = {m for m in re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.M)}
    assert set(drafter_names()) <= rows, set(drafter_names()) - rows


def test_no_development_history():
    """No development rounds and no files named by them (the results table names its own commit, which is fine)."""
    history = re.compile(r"[Ss]ession \d+|_v\d+\b|_s\d\d_")
    assert not history.findall(README), history.findall(README)
