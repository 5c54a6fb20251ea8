"""Logprobs: each emitted token's log-probability under the target, the same with and without speculation.

A verify pass scores every emitted token (drafted and accepted, or the target's own), so the logprobs come
from its rows; these tests check them against a direct forward of transformers' model over the final text,
and that drafts of any kind (chain, tree, batch) leave them unchanged.
"""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.logprobs import token_logprobs
from specdec.models.loading import load_model
from tiny import ModelLogits, TableTreeDrafter, loaded, tiny_llama

PROMPT = [5, 9, 11, 5, 9, 11, 5, 9, 2, 7, 5, 9]


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


def _direct(hf_model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """log-softmax of transformers' logits at each generated position: (len(generated), V)."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + generated])).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1: -1].float(), dim=-1)


def test_token_logprobs_of_rows():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    got = token_logprobs(logits, [1, 0], top=2)  # the third row is not used
    want = torch.log_softmax(logits, dim=-1)
    assert [t.token_id for t in got] == [1, 0]
    assert got[0].logprob == pytest.approx(want[0, 1].item())
    assert [i for i, _ in got[0].top] == [2, 1] and got[0].top[0][1] == pytest.approx(want[0, 2].item())
    assert [i for i, _ in got[1].top] == [0, 1]
    assert token_logprobs(logits, [2], top=0)[0].top == ()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_equal_a_direct_forward(target_model, temperature):
    decoder = SpecDecoder(loaded(target_model, "torch"), NgramDrafter(min_n=1, max_n=3),
                          SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    config = GenerationConfig.create(max_new_tokens=24, ignore_eos=True, temperature=temperature, seed=3, logprobs=5)
    state = decoder.complete(PROMPT, config)
    want = _direct(target_model, PROMPT, state.generated)
    assert [t.token_id for t in state.logprobs] == state.generated
    for j, entry in enumerate(state.logprobs):
        assert entry.logprob == pytest.approx(want[j, entry.token_id].item(), abs=1e-4)
        top_ids = [i for i, _ in entry.top]
        assert top_ids == want[j].topk(5).indices.tolist()
        if temperature == 0.0:
            assert top_ids[0] == entry.token_id  # greedy picks the most likely token


@pytest.mark.parametrize("kind", ["ngram", "self", "tree"])
def test_speculation_leaves_logprobs_unchanged(target_model, kind):
    """On the batch-invariant kernels (float32) the logprobs are bit for bit those of plain decoding."""
    target = loaded(target_model, "kernels")
    drafter = {"ngram": NgramDrafter(min_n=1, max_n=3),
               "self": DraftModelDrafter(loaded(target_model, "kernels").backend, target_model.config.vocab_size),
               "tree": TableTreeDrafter(ModelLogits(target_model), width=2, depth=3)}[kind]
    config = GenerationConfig.create(max_new_tokens=30, ignore_eos=True, logprobs=3)
    plain = SpecDecoder(target, None).complete(PROMPT, config)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    spec = decoder.complete(PROMPT, config)
    assert spec.metrics.accepted_tokens > 0
    assert spec.generated == plain.generated
    assert spec.logprobs == plain.logprobs


def test_batched_logprobs_equal_each_request_alone(target_model):
    target = loaded(target_model, "kernels")
    decoder = SpecDecoder(target, NgramDrafter(min_n=1, max_n=3), SpeculationConfig(num_speculative_tokens=4))
    config = GenerationConfig.create(max_new_tokens=20, ignore_eos=True, logprobs=2)
    prompts = [PROMPT[i:] for i in range(4)]
    engine = decoder.batch_engine(4)
    states = [engine.submit(i, p, config) for i, p in enumerate(prompts)]
    while len(engine):
        engine.step()
    for prompt, state in zip(prompts, states):
        alone = SpecDecoder(target, None).complete(prompt, config)
        assert state.logprobs == alone.logprobs


def test_stop_string_drops_the_logprobs_after_it(tiny_folder):
    target = load_model(str(tiny_folder), dtype="float32")
    plain = SpecDecoder(target, None)
    full = plain.generate("a big red dog", max_new_tokens=40, ignore_eos=True).text
    stop = " ".join(full.split()[3:5])
    for decoder in (plain, SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(4, adaptive=False))):
        result = decoder.generate("a big red dog", max_new_tokens=40, ignore_eos=True, stop=[stop], logprobs=1)
        assert result.finish_reason == "stop"
        assert [t.token_id for t in result.logprobs] == result.token_ids
    assert plain.generate("a big red dog", max_new_tokens=5).logprobs is None  # only when asked for


def test_config_refuses_bad_logprobs():
    for bad in (-1, 21, True, 2.0):
        with pytest.raises(ConfigError):
            GenerationConfig.create(logprobs=bad)


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_prompt_logprobs_equal_a_direct_forward_alone_or_batched(target_model, backend):
    """The prefill scores every prompt token (the first has no logprob), in one pass or in a batch."""
    target = loaded(target_model, backend)
    config = GenerationConfig.create(max_new_tokens=3, ignore_eos=True, prompt_logprobs=2)
    decoder = SpecDecoder(target, NgramDrafter(min_n=1, max_n=3))
    alone = decoder.complete(PROMPT, config)
    with torch.no_grad():
        want = torch.log_softmax(target_model(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    entries = alone.prompt_logprobs
    assert [e.token_id for e in entries] == PROMPT and entries[0].logprob is None
    for j, entry in enumerate(entries[1:]):
        assert entry.logprob == pytest.approx(want[j, PROMPT[j + 1]].item(), abs=1e-4)
        assert [i for i, _ in entry.top] == want[j].topk(2).indices.tolist()
    engine = decoder.batch_engine(3)
    plain = GenerationConfig.create(max_new_tokens=3, ignore_eos=True)
    states = [engine.submit(0, PROMPT, config), engine.submit(1, PROMPT[2:], plain), engine.submit(2, PROMPT, config)]
    while len(engine):
        engine.step()
    assert states[1].prompt_logprobs is None
    for state in (states[0], states[2]):
        assert [e.token_id for e in state.prompt_logprobs] == PROMPT
        got = [e.logprob for e in state.prompt_logprobs[1:]]
        assert got == pytest.approx([e.logprob for e in entries[1:]], abs=0 if backend == "kernels" else 1e-5)
        assert state.generated == alone.generated


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_processed_logprobs_are_of_the_distribution_sampled_from(target_model, backend):
    """logprobs_mode "processed": each token's log-probability under the temperature- and top-k-warped distribution
    it was drawn from, only the tokens that survive the filter listed; the same with and without drafts."""
    from specdec.sampling import warp_logits

    target = loaded(target_model, backend)
    config = GenerationConfig.create(max_new_tokens=20, ignore_eos=True, temperature=0.7, top_k=5, seed=4, logprobs=8,
                                     logprobs_mode="processed")
    coupled = SpeculationConfig(num_speculative_tokens=4, adaptive=False, sampling_verifier="coupled")
    plain = SpecDecoder(target, None, coupled).generate(PROMPT, config)
    drafted = SpecDecoder(target, NgramDrafter(min_n=1, max_n=3), coupled).generate(PROMPT, config)
    assert drafted.token_ids == plain.token_ids and drafted.metrics.drafted_tokens > 0
    with torch.no_grad():
        logits = target_model(torch.tensor([PROMPT + plain.token_ids])).logits[0, len(PROMPT) - 1: -1].float()
    want = torch.log_softmax(warp_logits(logits, config.sampling), dim=-1)
    for j, (a, b) in enumerate(zip(plain.logprobs, drafted.logprobs)):
        assert a.logprob == pytest.approx(want[j, a.token_id].item(), abs=1e-4)
        assert len(a.top) == 5 and [i for i, _ in a.top] == want[j].topk(5).indices.tolist()  # the 5 top_k left
        assert b.token_id == a.token_id and b.logprob == pytest.approx(a.logprob, abs=1e-5)
    raw = SpecDecoder(target, None, coupled).generate(PROMPT, GenerationConfig.create(
        max_new_tokens=20, ignore_eos=True, temperature=0.7, top_k=5, seed=4, logprobs=8))
    assert raw.token_ids == plain.token_ids and len(raw.logprobs[0].top) == 8  # raw: the model's, unfiltered


def test_processed_logprobs_follow_the_logit_bias_of_a_greedy_request(target_model):
    target = loaded(target_model, "kernels")
    raw = SpecDecoder(target, None).generate(PROMPT, max_new_tokens=6, ignore_eos=True, logprobs=3)
    runner_up = raw.logprobs[0].top[1][0]
    biased = SpecDecoder(target, None).generate(PROMPT, max_new_tokens=6, ignore_eos=True, logprobs=3,
                                               logit_bias={runner_up: 50.0}, logprobs_mode="processed")
    assert biased.token_ids[0] == runner_up and biased.logprobs[0].logprob > -1e-3  # near-certain after the bias
    with pytest.raises(ConfigError, match="logprobs_mode"):
        GenerationConfig(logprobs_mode="softmax")


def test_the_servers_logprobs_mode_reaches_every_request():
    pytest.importorskip("fastapi")
    from specdec.server.binding import parse_request
    from specdec.server.schemas import Limits

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}
    for mode in ("raw", "processed"):
        limits = Limits(model_names=("m",), drafters=("none",), default_drafter="none", vocab_size=64,
                        logprobs_mode=mode)
        assert parse_request(body, "chat", limits).config.logprobs_mode == mode
