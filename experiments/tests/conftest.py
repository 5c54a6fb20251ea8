"""The experiments' tests. They are not part of specdec's suite (pyproject's testpaths is tests/) and may fall behind
the product; run them with `python -m pytest -q -n 0 experiments/tests`. They import the experiments' modules by
name (experiments/ on the path, as `python experiments/<script>.py` has it) and the suite's tiny models
(tests/tiny.py)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1] / "tests")]
