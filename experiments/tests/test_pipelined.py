"""Pipelined EAGLE chains (experiments/pipelined.py): the work drafted behind a verify pass is the chain the head would
have drafted anyway, it is used only where its context came true, and output stays the target's."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Budget, DraftRequest
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.eagle_head import new_head
from specdec.engine import SpecDecoder

from pipelined import Ahead, PipelinedChain, side_stream
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


def _head(model, seed=1):
    torch.manual_seed(seed)
    return new_head(model, "tiny", torch.arange(model.config.vocab_size))


def test_the_work_ahead_continues_the_chain_the_head_would_draft(model):
    """Draft k, the bonus guess, then k more: the first 2k + 1 tokens of one longer chain from the same state."""
    target = loaded(model)
    head = _head(model)
    prompt = list(range(5, 17))
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    chain, piped = EagleDrafter(head, tree=False), PipelinedChain(EagleDrafter(head, tree=False))
    for d in (chain, piped):
        d.begin(DraftRequest(prompt_ids=prompt))
        d.observe(out.hidden[:-1])
    k = 3
    long = chain.propose(prompt, Budget(2 * k + 1)).tokens.tolist()
    draft = piped.propose(prompt, Budget(k)).tokens.tolist()
    piped._join()
    ahead = piped._ahead
    assert draft + [ahead.expected[-1]] + ahead.tokens == long
    assert ahead.expected == prompt + long[: k + 1]
    # the next step's context is the one drafted for: its draft is the work ahead, taken without drafting
    again = piped.propose(ahead.expected, Budget(k)).tokens.tolist()
    assert again == long[k + 1:] and piped.hits == 1 and piped.launched == 2
    # a context that did not come true drops it: drafted afresh, as the plain chain drafts it
    other = prompt + long[:1] + [(long[1] + 1) % model.config.vocab_size]
    piped._join()
    piped.observe(target.backend.forward(target.backend.new_cache(), torch.tensor(other), output_hidden=True)
                  .hidden[len(prompt) - 1: -1])
    chain.observe(target.backend.forward(target.backend.new_cache(), torch.tensor(other), output_hidden=True)
                  .hidden[len(prompt) - 1: -1])
    assert piped.propose(other, Budget(k)).tokens.tolist() == chain.propose(other, Budget(k)).tokens.tolist()
    assert piped.hits == 1
    piped.close()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_pipelined_drafting_keeps_greedy_output(model, k):
    """An untrained head: most work ahead is dropped, and the output is exactly the target's."""
    target = loaded(model)
    drafter = PipelinedChain(EagleDrafter(_head(model), tree=False))
    threads = torch.get_num_threads()
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=k, adaptive=False))
    assert drafted_keeping_greedy_output(decoder, target) > 0
    assert drafter.launched > 0
    assert torch.get_num_threads() == threads  # the main thread's count is restored after each window
    drafter.close()


def _always_zero(seed=3):
    """A target whose logits are all zero (greedy picks token 0 everywhere) and a head reading its LM head: every
    chain and bonus guess is right, so every step after the first drafts from the work ahead."""
    model = tiny_llama(seed=seed, hidden=64, heads=4, kv_heads=2)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    return model


@pytest.mark.parametrize("corrupt", [False, True])
def test_work_ahead_that_came_true_is_used_and_still_verified(monkeypatch, corrupt):
    """Where the context comes true the step drafts from the work ahead (hits); corrupted work ahead (tokens the
    target never picks) is rejected by verification: the output is the target's either way."""
    model = _always_zero()
    target = loaded(model)
    drafter = PipelinedChain(EagleDrafter(_head(model), tree=False))
    if corrupt:
        real = PipelinedChain._ahead_of

        def wrong(self, drafted, state, k, stream):
            ahead = real(self, drafted, state, k, stream)
            return Ahead(ahead.expected, [5] * len(ahead.tokens), ahead.states)
        monkeypatch.setattr(PipelinedChain, "_ahead_of", wrong)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    prompt = [3, 9, 27, 17, 51]
    plain, _ = SpecDecoder(target, None).generate_ids(prompt, config)
    out, metrics = decoder.generate_ids(prompt, config)
    assert out == plain == [0] * 24
    assert drafter.hits > 0
    if corrupt:
        assert metrics.accepted_tokens < metrics.drafted_tokens
    else:
        assert metrics.accepted_tokens == metrics.drafted_tokens
    drafter.close()


def test_tree_drafters_and_sampling_are_not_pipelined(model):
    head = _head(model)
    with pytest.raises(ValueError, match="pipelines chains"):
        PipelinedChain(EagleDrafter(head, tree=True))
    target = loaded(model)
    drafter = PipelinedChain(EagleDrafter(head, tree=False))
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=3, adaptive=False))
    decoder.generate_ids([1, 2, 3, 4], GenerationConfig.create(max_new_tokens=12, temperature=0.8, seed=0, ignore_eos=True))
    assert drafter.launched == 0  # sampled requests are drafted by the wrapped drafter, in order


def test_no_side_stream_on_a_cpu():
    assert side_stream(torch.device("cpu")) is None
