"""SpecDecoder.close() and `with SpecDecoder.load(...) as decoder:` release what the decoder holds: once closed and
nothing else refers to them, the target's backend, its KV pool and the drafters are gone; the decoder then refuses
work with one clear error, and closing twice does nothing."""
import gc
import weakref

import pytest

from specdec.engine import SpecDecoder
from specdec.errors import ConfigError


@pytest.mark.parametrize("backend", ["torch", "kernels"])
def test_leaving_the_with_block_releases_the_model_caches_and_drafters(served_folder, backend):
    if backend == "kernels":
        kernels = pytest.importorskip("specdec.kernels")
        if kernels.unavailable_reason():
            pytest.skip(kernels.unavailable_reason())
    with SpecDecoder.load(str(served_folder), drafter="suffix", dtype="float32", backend=backend) as decoder:
        decoder.enable_prefix_cache(4)
        text = decoder.generate("a big red dog", max_new_tokens=6, ignore_eos=True).text
        assert decoder.generate("a big red dog", max_new_tokens=6, ignore_eos=True, drafter="ngram").text == text
        held = [weakref.ref(x) for x in (decoder.target.backend, decoder.target.hf_model, decoder.drafter,
                                          decoder.drafter_named("ngram"))]
        assert all(ref() is not None for ref in held)
    gc.collect()
    assert [ref() for ref in held] == [None] * len(held)
    with pytest.raises(ConfigError, match="closed"):
        decoder.generate("a big red dog", max_new_tokens=2)
    decoder.close()  # a second close does nothing


def test_an_open_decoder_keeps_its_model(tiny_folder):
    """The property above is close()'s doing: without it the same references stay alive."""
    decoder = SpecDecoder.load(str(tiny_folder), drafter="none", dtype="float32", backend="torch")
    held = weakref.ref(decoder.target.backend)
    gc.collect()
    assert held() is not None
    decoder.close()
    gc.collect()
    assert held() is None
