"""The learning curve's PNG, for heads that recorded answer tokens seen and for the shipped head, which did not."""
import json
from pathlib import Path

import pytest

from specdec.training.trainer import plot_learning_curve

SHIPPED = Path(__file__).parent.parent / "specdec/assets/heads/smollm2-135m/eagle_config.json"


def test_the_shipped_heads_learning_curve_is_drawn_against_steps(tmp_path):
    pytest.importorskip("matplotlib")
    history = json.loads(SHIPPED.read_text())["training"]["history"]
    assert history and all("tokens_seen" not in h for h in history)
    assert plot_learning_curve(history, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_an_empty_history_draws_nothing(tmp_path):
    assert not plot_learning_curve([], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
