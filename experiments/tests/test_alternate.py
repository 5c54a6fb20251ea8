"""The A/B loop of the experiments (experiments/alternate.py): methods alternated prompt by prompt, and the quantized
copy under a name of its own."""
import pytest
import torch

from tiny import loaded, tiny_llama


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(seed=3, vocab=96, hidden=96, heads=6, kv_heads=2, layers=1, init_range=0.1)
    return model, loaded(model, "kernels", slots=2).backend


def test_alternated_methods_rotate_and_count_equal_outputs(monkeypatch):
    """experiments/isa_speedup.py's and experiments/vnni_speedup.py's loop: every method runs every prompt, in an order that
    rotates, and a prompt counts as equal only when every method gave the same tokens."""
    from types import SimpleNamespace

    from alternate import alternate

    calls = []

    class Decoder:
        def encode(self, text):
            return [len(text)]

        def complete(self, ids, config, drafter=None):
            calls.append(drafter)
            tokens = [1, 2] if drafter != "odd" or ids != [3] else [1, 3]
            return SimpleNamespace(generated=tokens, metrics=SimpleNamespace(steps=1, draft_time_s=0.5))

    prompts = [SimpleNamespace(text=t) for t in ("a", "bb", "ccc")]
    totals, equal = alternate(Decoder(), prompts, None, {"none": None, "d": "default", "o": "odd"})
    assert calls == [None, "default", "odd", "default", "odd", None, "odd", None, "default"]
    assert equal == 2  # the third prompt differs under "odd"
    assert totals["d"]["tokens"] == 6 and totals["d"]["steps"] == 3 and totals["d"]["draft_s"] == 1.5
    assert totals["d"]["mean_accepted_tokens"] == 2.0 and totals["d"]["tokens_per_s"] > 0

    # a method may run on a decoder of its own; each prompt's outputs go to `each`
    class Other(Decoder):
        def complete(self, ids, config, drafter=None):
            calls.append(("other", drafter))
            return SimpleNamespace(generated=[7], metrics=SimpleNamespace(steps=1, draft_time_s=0.0))

    calls.clear()
    seen = []
    totals, equal = alternate(Decoder(), prompts[:2], None, {"none": None, "x": (Other(), "default")},
                              each=lambda prompt, outputs: seen.append((prompt.text, outputs)))
    assert calls == [None, ("other", "default"), ("other", "default"), None]
    assert seen == [("a", {"none": [1, 2], "x": [7]}), ("bb", {"x": [7], "none": [1, 2]})]
    assert equal == 0 and totals["x"]["tokens"] == 2


def test_a_named_copy_runs_its_passes_in_the_order_it_names_and_keeps_its_name(target):
    """experiments/split_attention_speedup.py's drafters: the one in the target's order turns the pieces off for its own
    passes only, and forks keep the name (each name keeps its own measured costs)."""
    from specdec import kernels
    from alternate import named_copy

    model, backend = target
    module = kernels.load() if not kernels.unavailable_reason() else pytest.skip("no kernels")
    seen = []
    real = module.set_split_attention

    class Spy:  # records each setting the drafter asks for, and passes it on
        def set_split_attention(self, on):
            seen.append(on)
            return real(on)

    drafter = named_copy(backend, backend.four_bit_copy(), "quantized_rows", False, Spy())
    assert seen and set(seen[::2]) == {False} and set(seen[1::2]) == {True}  # its pass costs, measured in its order
    seen.clear()
    cache = backend.new_cache()
    try:
        backend.forward(cache, torch.arange(1, 20))
        drafter._passes([cache], [19], [[3]])
    finally:
        backend.release(cache)
    assert seen == [False, True] and real(True) is True  # off for the pass, then back as it was
    assert drafter.name == "quantized_rows" and drafter.fork().name == "quantized_rows"
