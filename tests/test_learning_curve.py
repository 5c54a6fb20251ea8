"""The learning curve's PNG: against answer tokens seen, or against optimizer steps for heads trained before those
were recorded."""
import json
from pathlib import Path

import pytest

from specdec.training.trainer import plot_learning_curve

SHIPPED = Path(__file__).parent.parent / "specdec/assets/heads/smollm2-135m/eagle_config.json"
# the third training run of the shipped head recorded steps only (docs/experiments/shipped-heads.md)
STEPS_ONLY = [{"step": 92, "elapsed_s": 301.3, "acc1": 0.682, "acc2": 0.633, "acc3": 0.61, "chain_mat": 2.377},
              {"step": 942, "elapsed_s": 2701.8, "acc1": 0.724, "acc2": 0.689, "acc3": 0.669, "chain_mat": 2.558}]


def x_labels_drawn(monkeypatch, history, path) -> set:
    """The x-axis labels plot_learning_curve gives its two panels while drawing `history` to `path`."""
    from matplotlib.axes import Axes

    labels, original = set(), Axes.set

    def recording(self, **kwargs):
        labels.add(kwargs.get("xlabel"))
        return original(self, **kwargs)

    monkeypatch.setattr(Axes, "set", recording)
    assert plot_learning_curve(history, path)
    assert path.read_bytes()[:4] == b"\x89PNG"
    return labels


def test_the_shipped_heads_learning_curve_is_drawn_against_tokens_seen(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    history = json.loads(SHIPPED.read_text())["training"]["history"]
    assert history and all("tokens_seen" in h for h in history)
    assert x_labels_drawn(monkeypatch, history, tmp_path / "curve.png") == {"answer tokens seen (millions)"}


def test_a_history_without_tokens_seen_is_drawn_against_steps(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    assert x_labels_drawn(monkeypatch, STEPS_ONLY, tmp_path / "curve.png") == {"optimizer steps"}


def test_an_empty_history_draws_nothing(tmp_path):
    assert not plot_learning_curve([], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
