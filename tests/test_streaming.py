"""Text streaming and stop strings, through the engine and a real (word-level) tokenizer."""
import pytest

from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model


@pytest.fixture(scope="module")
def decoders(tiny_folder):
    target = load_model(str(tiny_folder), dtype="float32")
    return SpecDecoder(target, None), SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(4, adaptive=False))


def test_stream_deltas_concatenate_to_the_result(decoders):
    for decoder in decoders:
        stream = decoder.stream("the cat sat on the mat", max_new_tokens=30)
        text = "".join(stream)
        assert text == stream.result.text
        assert stream.result.token_ids
        assert decoder.target.tokenizer.decode(stream.result.token_ids, skip_special_tokens=True) == text


def test_stop_string_cuts_text_identically_with_and_without_drafts(decoders):
    plain, spec = decoders
    full = plain.generate("a big red dog", max_new_tokens=40, ignore_eos=True).text
    words = full.split()
    assert len(words) > 6
    stop = " ".join(words[3:5])
    results = [d.generate("a big red dog", max_new_tokens=40, ignore_eos=True, stop=[stop]) for d in decoders]
    for r in results:
        assert r.text == full[: full.index(stop)]
        assert r.finish_reason == "stop"
    assert results[0].token_ids == results[1].token_ids
    streamed = "".join(spec.stream("a big red dog", max_new_tokens=40, ignore_eos=True, stop=[stop]))
    assert streamed == results[0].text


def test_chat_template_is_applied(decoders):
    plain, _ = decoders
    ids = plain.encode("the cat")
    text = plain.target.tokenizer.decode(ids)
    assert text.startswith("<|user|>") and "<|assistant|>" in text
    assert plain.encode([5, 6, 7]) == [5, 6, 7]
