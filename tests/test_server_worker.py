"""The engine worker in process: requests join within a prefill budget, cancellation frees the slot,
stop strings end a request, and a failing engine step fails only the batch (the worker keeps serving)."""
import queue

import pytest

pytest.importorskip("fastapi")

from specdec.choice import OWN_DRAFTER, PLAIN  # noqa: E402
from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig  # noqa: E402
from specdec.drafters.lookup.ngram import NgramDrafter  # noqa: E402
from specdec.engine import SpecDecoder  # noqa: E402
from specdec.models.loading import load_model  # noqa: E402
from specdec.server.schemas import GenerationRequest, SpeculationChoice  # noqa: E402
from specdec.server.events import Delta, Failed, Finished, Job, Started  # noqa: E402
from specdec.server.worker import EngineWorker  # noqa: E402


@pytest.fixture(scope="module")
def decoder(tiny_folder):
    return SpecDecoder(load_model(str(tiny_folder), dtype="float32"), NgramDrafter(1, 3))


def request(prompt="the cat sat on the mat", max_tokens=20, stop=()):
    config = GenerationConfig(max_new_tokens=max_tokens, stop=tuple(stop), ignore_eos=True)
    return GenerationRequest(endpoint="completions", model="tiny", prompt=prompt, config=config, max_tokens_given=True,
                             speculation=SpeculationChoice("ngram"), stream=False, include_usage=False)


def submit(worker, rid, req):
    events = queue.SimpleQueue()
    worker.submit(Job(rid, req, events.put))
    return events


def until_end(events, timeout=30):
    out = []
    while not out or not isinstance(out[-1], (Finished, Failed)):
        out.append(events.get(timeout=timeout))
    return out


def test_requests_join_within_the_prefill_budget(decoder):
    worker = EngineWorker(decoder, max_batch=4, max_prefill_tokens=1)
    for rid in "abc":
        submit(worker, rid, request())
    worker._drain(block=False)
    worker._admit()
    assert len(worker.engine.waiting) == 1 and len(worker.pending) == 2  # one request per step
    worker.max_prefill_tokens = 10_000
    worker._admit()
    assert len(worker.engine.waiting) == 3 and not worker.pending


@pytest.mark.parametrize("max_tokens", [2, 3, 6])
def test_short_requests_deliver_all_their_text(decoder, max_tokens):
    """A request that ends in its first decoding step (max_tokens 2, or a few tokens the drafts fill at once) still
    delivers every token's text: a step reports each request once, after its prefill's report."""
    worker = EngineWorker(SpecDecoder(decoder.target, NgramDrafter(1, 3)), max_batch=2)  # costs of its own
    worker.start()
    try:
        prompt = "the cat sat on the mat the cat sat on the mat the cat"
        want = SpecDecoder(decoder.target, None, chat=False).generate(prompt, max_new_tokens=max_tokens,
                                                                      ignore_eos=True)
        events = until_end(submit(worker, "a", request(prompt, max_tokens)))
        assert "".join(e.text for e in events if isinstance(e, Delta)) == want.text
        assert sum(e.tokens for e in events if isinstance(e, Delta)) == events[-1].completion_tokens == max_tokens
    finally:
        worker.stop()


def test_cancel_and_stop_strings_free_the_slot(decoder):
    worker = EngineWorker(decoder, max_batch=2)
    worker.start()
    try:
        full = "".join(e.text for e in until_end(submit(worker, "a", request())) if isinstance(e, Delta))
        stop = full.split()[2]
        events = until_end(submit(worker, "b", request(stop=[stop])))
        assert isinstance(events[0], Started) and events[-1].finish_reason == "stop"
        assert "".join(e.text for e in events if isinstance(e, Delta)) == full[: full.index(stop)]
        long = submit(worker, "c", request(max_tokens=400, prompt="the"))
        assert isinstance(long.get(timeout=30), Started)
        worker.cancel("c")
        assert isinstance(until_end(submit(worker, "d", request(max_tokens=2)))[-1], Finished)
        assert len(worker.engine) == 0 and worker.engine.free_slots == 2
        rest = []
        while not long.empty():
            rest.append(long.get())
        assert not any(isinstance(e, (Finished, Failed)) for e in rest)  # "c" ended by cancellation
    finally:
        worker.stop()


def test_a_failing_step_fails_the_batch_and_the_worker_keeps_serving(decoder, monkeypatch):
    worker = EngineWorker(decoder, max_batch=2)
    real_step = worker.engine.step
    monkeypatch.setattr(worker.engine, "step", lambda: 1 / 0)
    worker.start()
    try:
        failed = until_end(submit(worker, "a", request()))[-1]
        assert isinstance(failed, Failed) and failed.error.status == 500
        assert worker.engine.free_slots == 2
        monkeypatch.setattr(worker.engine, "step", real_step)
        assert isinstance(until_end(submit(worker, "b", request()))[-1], Finished)
    finally:
        worker.stop()
    assert not worker.thread.is_alive()


def test_a_drafter_chosen_by_requests_is_built_once_and_forked_for_each(decoder, monkeypatch):
    import specdec.drafters as drafters

    built = []
    real = drafters.create_drafter
    monkeypatch.setattr(drafters, "create_drafter", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    worker = EngineWorker(decoder, max_batch=2)
    made = [worker._drafter(SpeculationChoice("layerskip"))[0].drafter for _ in range(3)]
    assert built == ["layerskip"]  # built once
    assert len({id(d) for d in made}) == 3 and all(d.name == "layerskip" for d in made)  # each request its own state
    assert worker._drafter(SpeculationChoice("ngram"))[0] == OWN_DRAFTER  # the decoder's own, forked by the engine
    assert worker._drafter(SpeculationChoice("none"))[0] == PLAIN


def test_a_suffix_drafter_chosen_by_requests_keeps_the_servers_index_file(decoder, tmp_path):
    """`specdec serve --drafter ngram --suffix-index FILE`: requests that pick suffix draft from (and add to) FILE."""
    path = tmp_path / "outputs.safetensors"
    worker = EngineWorker(decoder, max_batch=2, drafter_options={"suffix_index": str(path)})
    worker.start()
    try:
        req = request()
        suffix = GenerationRequest(**{**req.__dict__, "speculation": SpeculationChoice("suffix")})
        first = until_end(submit(worker, "a", suffix))[-1]
        assert isinstance(first, Finished) and path.exists()  # the first output is written at once
        again = until_end(submit(worker, "b", suffix))[-1]
        # drafted from the first answer, held by the file's index
        assert again.metrics.accepted_tokens >= 5 and again.metrics.accepted_tokens > first.metrics.accepted_tokens
    finally:
        worker.stop()
    index = decoder.drafter_named("suffix", suffix_index=str(path)).shared
    assert index.path == path and len(index.sequences) == 2


def test_requests_may_pick_the_head_specdec_ships_for_the_model():
    from types import SimpleNamespace

    from specdec.server.state import ServerSettings, ServerState

    def limits(model: str) -> tuple:
        target = SimpleNamespace(name=model, info=SimpleNamespace(vocab_size=64, eos_token_ids=(1,), max_context=512),
                                 tokenizer=None)
        worker = SimpleNamespace(decoder=SimpleNamespace(target=target), default_drafter="ngram")
        return ServerState(ServerSettings(model_name=model), worker, None).limits.drafters

    assert limits("smollm2-135m") == ("none", "ngram", "suffix", "recycle", "eagle", "medusa", "select")
    assert limits("tiny") == ("none", "ngram", "suffix", "recycle", "select")


@pytest.mark.parametrize("verifier", ["coupled", "rejection"])
def test_a_request_may_ask_for_seed_stable_coupled_verification(decoder, verifier):
    """speculation.sampling_verifier "coupled": a sampled request gives the same text for the same seed whether it
    drafts or not; the server's rejection sampling (the control) does not."""
    spec = SpeculationConfig(4, adaptive=False)  # drafts every step
    worker = EngineWorker(SpecDecoder(decoder.target, NgramDrafter(1, 3), spec), max_batch=2)
    worker.start()
    try:
        same, drafted = [], 0
        for seed in range(4):
            config = GenerationConfig(max_new_tokens=24, ignore_eos=True,
                                      sampling=SamplingConfig(temperature=0.8, seed=seed))
            texts = []
            for choice in (SpeculationChoice("none", None, verifier), SpeculationChoice("ngram", 4, verifier)):
                req = GenerationRequest(**{**request("the dog ran to the dog ran to the").__dict__, "config": config,
                                           "speculation": choice})
                events = until_end(submit(worker, f"{seed}{choice.drafter}", req))
                texts.append("".join(e.text for e in events if isinstance(e, Delta)))
                drafted += events[-1].metrics.drafted_tokens
            same.append(texts[0] == texts[1])
    finally:
        worker.stop()
    assert drafted > 0
    assert all(same) if verifier == "coupled" else not all(same)


@pytest.mark.parametrize("cancelled,when", [("first", "before the prefill"), ("second", "before the prefill"),
                                            ("second", "after the prefill")])
def test_identical_prompts_together_with_one_cancelled_never_fail_the_others(decoder, cancelled, when):
    """The issue that began the soak: identical prompts arriving together share one prefill (the first admitted
    leads, the others copy its KV cache); one client disconnecting, and the lead ending in its first token (one
    token asked), must never fail another request (the batch prefill used to copy the cache of a lead already
    released, and the whole batch failed with a 500). Every request not cancelled gets its own greedy text."""
    worker = EngineWorker(SpecDecoder(decoder.target, NgramDrafter(1, 3)), max_batch=4)
    prompt = "the cat sat on the mat and the dog ran to the house"
    lengths = {"first": 1, "second": 8, "third": 12, "fourth": 1}  # "first" leads; it and "fourth" end at once
    events = {rid: submit(worker, rid, request(prompt, n)) for rid, n in lengths.items()}

    def step():
        worker._drain(block=False)
        worker._admit()
        if len(worker.engine):
            worker._step()

    worker._drain(block=False)
    worker._admit()  # all four wait in the engine for one shared prefill
    assert len(worker.engine.waiting) == 4
    if when == "after the prefill":
        worker._step()
    worker.cancel(cancelled)
    for _ in range(100):
        step()
        if not len(worker.engine) and not worker.pending:
            break
    got = {}
    while True:
        try:
            rid, event = next((rid, q.get_nowait()) for rid, q in events.items() if not q.empty())
        except StopIteration:
            break
        got.setdefault(rid, []).append(event)
    assert not any(isinstance(e, Failed) for es in got.values() for e in es), got
    alone = SpecDecoder(decoder.target, None, chat=False)
    for rid, n in lengths.items():
        if rid == cancelled:
            assert not any(isinstance(e, Finished) for e in got.get(rid, [])) or when == "after the prefill"
            continue
        assert isinstance(got[rid][-1], Finished), (rid, got[rid])
        text = "".join(e.text for e in got[rid] if isinstance(e, Delta))
        assert text == alone.generate(prompt, max_new_tokens=n, ignore_eos=True).text, rid


def test_a_request_whose_constraint_cannot_go_on_fails_alone_with_a_400(tmp_path_factory):
    """The fuzzer's 500 on smollm2-135m: a guided_regex needing a byte the vocabulary has no token for. It used to
    raise in the batch's step, and the worker failed every request of the batch with a 500; now that request
    alone gets a 400 (constraint_unsatisfiable) and the others in its batch their own text."""
    from specdec.config import Constraint
    from specdec.server.errors import APIError
    from tiny import write_tiny_bpe_folder

    folder = write_tiny_bpe_folder(tmp_path_factory.mktemp("gap") / "bpe", seed=0, missing="Ą")  # no byte 0x04
    target = load_model(str(folder), dtype="float32", backend="torch")
    worker = EngineWorker(SpecDecoder(target, NgramDrafter(1, 3)), max_batch=4)
    prompt = "the cat sat on the mat"
    plain = request(prompt, 8)
    bad = GenerationRequest(endpoint="completions", model="tiny", prompt=prompt, max_tokens_given=True,
                            config=GenerationConfig(max_new_tokens=8, constraint=Constraint("regex", "\x04x")),
                            speculation=SpeculationChoice("ngram"), stream=False, include_usage=False)
    events = {"before": submit(worker, "before", plain), "bad": submit(worker, "bad", bad),
              "after": submit(worker, "after", request("the dog ran", 6))}
    worker.start()
    try:
        got = {rid: until_end(q) for rid, q in events.items()}
    finally:
        worker.stop()
    failure = got["bad"][-1]
    assert isinstance(failure, Failed) and isinstance(failure.error, APIError)
    assert failure.error.status == 400 and failure.error.code == "constraint_unsatisfiable"
    alone = SpecDecoder(target, None, chat=False)
    for rid, (text, n) in {"before": (prompt, 8), "after": ("the dog ran", 6)}.items():
        assert isinstance(got[rid][-1], Finished), got[rid]
        assert "".join(e.text for e in got[rid] if isinstance(e, Delta)) == alone.generate(
            text, max_new_tokens=n, ignore_eos=True).text
