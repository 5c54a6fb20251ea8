"""One stream core (engine.TextSteps) gives every consumer the same text: generate, stream, generate_many and the
server's worker cut a stop string at the same place, end with the same finish reason and keep the same logprobs,
with and without drafts."""
import queue

import pytest

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model


@pytest.fixture(scope="module")
def target(tiny_folder):
    return load_model(str(tiny_folder), dtype="float32")


def _served(decoder, ids, config, drafter):
    """(text, finish reason, logprobs) of a completions request through the server's engine worker."""
    pytest.importorskip("fastapi")
    from specdec.server.events import Delta, Failed, Finished, Job
    from specdec.server.schemas import GenerationRequest, SpeculationChoice
    from specdec.server.worker import EngineWorker

    worker = EngineWorker(decoder, max_batch=2)
    worker.start()
    try:
        events = queue.SimpleQueue()
        worker.submit(Job("r", GenerationRequest(endpoint="completions", model="tiny", prompt=list(ids), config=config,
                                                 max_tokens_given=True, speculation=SpeculationChoice(drafter),
                                                 stream=True, include_usage=False), events.put))
        out = []
        while not out or not isinstance(out[-1], (Finished, Failed)):
            out.append(events.get(timeout=60))
    finally:
        worker.stop()
    assert isinstance(out[-1], Finished), out[-1]
    deltas = [e for e in out if isinstance(e, Delta)]
    return "".join(d.text for d in deltas), out[-1].finish_reason, [t for d in deltas for t in d.logprobs or ()]


@pytest.mark.parametrize("drafted", [False, True])
def test_every_consumer_cuts_a_stop_string_alike(target, drafted):
    plain = SpecDecoder(target, None)
    decoder = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(4, adaptive=False)) if drafted else plain
    ids = plain.encode("a big red dog")
    full = plain.generate(ids, max_new_tokens=40, ignore_eos=True).text
    words = full.split()
    assert len(words) > 6
    stop = " ".join(words[3:5])
    config = GenerationConfig.create(max_new_tokens=40, ignore_eos=True, stop=[stop], logprobs=1)
    result = decoder.generate(ids, config)
    assert result.text == full[: full.index(stop)] and result.finish_reason == "stop"
    stream = decoder.stream(ids, config)
    assert "".join(stream) == result.text and stream.result.finish_reason == "stop"
    assert stream.result.token_ids == result.token_ids and stream.result.logprobs == result.logprobs
    other = plain.encode("the cat sat on the mat")
    many = decoder.generate_many([ids, other, ids], config, max_batch=2)
    for got in (many[0], many[2]):
        assert (got.text, got.finish_reason, got.token_ids) == (result.text, "stop", result.token_ids)
        assert [t.token_id for t in got.logprobs] == result.token_ids
    assert many[1].text == decoder.generate(other, config).text
    text, reason, logprobs = _served(decoder, ids, config, "ngram" if drafted else "none")
    assert (text, reason) == (result.text, "stop")
    assert [t.token_id for t in logprobs] == result.token_ids  # the logprobs after the stop string are dropped too


def test_a_length_limit_ends_every_consumer_alike(target):
    decoder = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(4, adaptive=False))
    ids = decoder.encode("the cat sat on the mat")
    config = GenerationConfig.create(max_new_tokens=7, ignore_eos=True)
    result = decoder.generate(ids, config)
    assert result.finish_reason == "length" and len(result.token_ids) == 7
    assert "".join(decoder.stream(ids, config)) == result.text
    assert decoder.generate_many([ids], config)[0].text == result.text
    assert _served(decoder, ids, config, "ngram")[:2] == (result.text, "length")
