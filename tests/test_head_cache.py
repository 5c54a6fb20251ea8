"""The EAGLE drafter's buffers: the head cache keeps a step's drafted rows past the true pairs when it grows, and the
features grow by appending, both without copying their history on every step."""
from types import SimpleNamespace

import torch

from specdec.drafters.heads.eagle_device import FeatureRows, HeadCache


def _rows(start: int, count: int, heads: int = 2, dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) (1, heads, count, dim) whose entries name their row: start, start + 1, ..."""
    keys = torch.arange(start, start + count, dtype=torch.float32)[None, None, :, None].expand(1, heads, count, dim)
    return keys.clone(), -keys.clone()


def test_drafted_rows_past_the_true_pairs_survive_the_buffer_growing():
    cache = HeadCache(SimpleNamespace(num_kv_heads=2, head_dim=4), torch.device("cpu"), torch.float32, capacity=4)
    cache.append(_rows(0, 3))  # three true pairs
    cache.write(3, _rows(3, 2))  # a drafted level past them: the buffer grows to 8
    cache.write(5, _rows(5, 6))  # the next level: it grows again, keeping the first level
    assert cache.capacity == 16 and cache.length == 3
    keys, values = cache.window(11)
    assert torch.equal(keys[0, 1, :, 0], torch.arange(11.0)) and torch.equal(values, -keys)
    assert torch.equal(cache.past()[0], keys[:, :, :3])
    cache.append(_rows(30, 1))  # the next true pair overwrites the drafted rows
    assert cache.length == 4 and cache.past()[0][0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 30.0]
    assert cache.window(0) is None


def test_features_grow_by_appending():
    features = FeatureRows(3, torch.device("cpu"), torch.float32, capacity=2)
    rows = torch.arange(21.0).view(7, 3)
    for start, end in ((0, 1), (1, 4), (4, 7)):
        features.append(rows[start:end])
        assert torch.equal(features.view(), rows[:end])
    assert features.buffer.shape[0] == 8
