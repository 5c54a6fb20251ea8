"""A bucket's inputs built in place on the host (models/host_inputs.py) are padded_inputs' (models/pass_graphs.py),
their definition, for any rows, caches and trees, and whatever an earlier step left in the buffers."""
import torch
from hypothesis import given, settings, strategies as st

from specdec.models.backend import SequenceCache
from specdec.models.host_inputs import HostInputs
from specdec.models.pass_graphs import padded_inputs
from specdec.verify import tree_mask

FIELDS = ("ids", "positions", "write_rows", "slots", "lengths", "tree")
SCRATCH = 300


SHAPES = [(1, 1), (1, 8), (2, 4), (4, 8), (3, 16)]


@st.composite
def rows_of(draw, shape):
    """The rows of one pass in a bucket of `shape`: (slot, cache length, token ids, tree parents or None); a tree
    takes one row alone, as FastLlama's passes do."""
    batch, tokens = shape
    tree = batch == 1 and tokens > 1 and draw(st.booleans())
    rows = []
    for slot in draw(st.permutations(range(6)))[:draw(st.integers(1, batch))]:
        n = tokens if tree else draw(st.integers(1, tokens))
        ids = draw(st.lists(st.integers(0, 99), min_size=n, max_size=n))
        parents = [draw(st.integers(-1, i - 1)) for i in range(n - 1)] if tree else None
        rows.append((slot, draw(st.integers(0, SCRATCH - 1 - n)), ids, parents))
    return rows


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_inputs_built_in_place_equal_padded_inputs(data):
    """Several passes through one bucket's buffers: each pass's inputs owe nothing to the one before."""
    shape = data.draw(st.sampled_from(SHAPES))
    host = HostInputs(*shape, SCRATCH, torch.device("cpu"))
    for _ in range(3):
        rows = data.draw(rows_of(shape))
        caches = [SequenceCache(length=length, slot=slot) for slot, length, _, _ in rows]
        ids = [torch.tensor(ids) for _, _, ids, _ in rows]
        mask = None if rows[0][3] is None else tree_mask(rows[0][3])
        host.fill(caches, ids, mask)
        want = padded_inputs(shape, caches, ids, mask, SCRATCH)
        for name in FIELDS:
            assert torch.equal(getattr(host.device, name), getattr(want, name)), name
        assert [c.length for c in caches] == [r[1] for r in rows]  # fill reads the caches, never moves them


def test_the_device_inputs_are_views_of_two_buffers():
    """Two copies a step (on a GPU) carry all six inputs: they share two allocations."""
    host = HostInputs(4, 8, SCRATCH, torch.device("cpu"))
    storages = {getattr(host.device, name).untyped_storage().data_ptr() for name in FIELDS}
    assert len(storages) == 2
