"""Prefix caching: a prompt that begins as an earlier sequence reuses that sequence's keys and values, and its
output and logits are exactly those of a fresh prefill; parked caches only occupy idle slots."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.kernels import has_bf16_products
from specdec.tokens import common_prefix
from tiny import loaded, tiny_llama

needs_bf16_products = pytest.mark.skipif(not has_bf16_products(), reason="the CPU lacks AVX-512 BF16")
VARIANTS = [("kernels", torch.float32), ("kernels", torch.bfloat16),
            pytest.param("kernels-bf16", torch.bfloat16, marks=needs_bf16_products), ("torch", torch.float32)]


def _prompt(n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, 63, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _target(backend, dtype, slots: int = 1):
    return loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2).to(dtype), backend, dtype=dtype, slots=slots)


@pytest.mark.parametrize("backend,dtype", VARIANTS)
@pytest.mark.parametrize("cut", [16, 37, 64])
def test_a_restored_prefix_scores_the_rest_of_the_prompt_as_a_fresh_prefill(backend, dtype, cut):
    """The prompt's rows after a restored prefix get the logits a prefill of the whole prompt gives them, bit for
    bit (bfloat16 prefill products included: the rest of the prompt is still the sequence's first pass)."""
    be = _target(backend, dtype).backend
    be.enable_prefix_cache(4)
    prompt = _prompt(90)
    fresh = be.new_cache()
    want = be.forward(fresh, torch.tensor(prompt)).logits
    be.release(fresh)
    earlier = be.new_cache()
    be.forward(earlier, torch.tensor(prompt[:cut] + _prompt(20, seed=9)))  # an earlier prompt: same beginning
    assert be.prefix_cache.park(prompt[:cut] + _prompt(20, seed=9), earlier)
    cache, features = be.prefix_cache.claim(prompt)
    assert cache.length == cut and cache.in_prompt and features is None
    got = be.forward(cache, torch.tensor(prompt[cut:])).logits
    assert torch.equal(got, want[cut:])


@pytest.mark.parametrize("backend,dtype", VARIANTS)
def test_a_conversation_reuses_its_earlier_turns_and_says_the_same(backend, dtype):
    """Each turn's prompt is the previous prompt, its answer and a new message: with the prefix cache the turns
    skip the reused part of their prefill, and every answer equals the one generated without it. Where the
    backend prefills with bfloat16 products (the kernels, bfloat16 weights, a CPU with AVX-512 BF16) only the
    prompts' rows are kept (the answers' rows were multiplied in float32, unlike a prefill); elsewhere the answers'
    rows are reused too."""
    target = _target(backend, dtype)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    speculation = SpeculationConfig(num_speculative_tokens=4)
    turns = [_prompt(40, seed=s) for s in (1, 2, 3)]

    def converse(cached: bool):
        decoder = SpecDecoder(target, NgramDrafter(1, 3), speculation)
        decoder.enable_prefix_cache(8 if cached else 0)
        prompt, answers, reused = [], [], []
        for turn in turns:
            prompt = prompt + turn
            out, metrics = decoder.generate_ids(prompt, config)
            answers.append(out)
            reused.append(metrics.cached_prompt_tokens)
            prompt = prompt + out
        return answers, reused

    plain, nothing = converse(False)
    answers, reused = converse(True)
    assert answers == plain and nothing == [0, 0, 0]
    prompt_rows_only = getattr(target.backend, "bf16_prefill", False)
    first, second = len(turns[0]), len(turns[0]) + len(plain[0]) + len(turns[1])
    if prompt_rows_only:
        assert reused == [0, first, second]
    else:  # the cache holds every token but the last answer token
        assert reused == [0, first + len(plain[0]) - 1, second + len(plain[1]) - 1]


def test_batched_requests_claim_prefixes_and_equal_each_request_alone():
    """A batch engine's newcomers restore their prefixes and prefill the rest together with fresh prompts."""
    target = _target("kernels", torch.float32, slots=4)  # a server's pool holds its batch and an idle slot
    decoder = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(num_speculative_tokens=4))
    alone = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    shared = _prompt(48, seed=11)
    prompts = [shared + _prompt(5 + i, seed=20 + i) for i in range(4)] + [_prompt(30, seed=40)]
    want = [alone.generate_ids(p, config)[0] for p in prompts]
    decoder.enable_prefix_cache(8)
    decoder.generate_ids(shared + _prompt(3, seed=99), config)  # leaves the shared beginning in the cache
    results = decoder.generate_many(prompts, config, max_batch=3)
    assert [r.token_ids for r in results] == want
    assert [r.metrics.cached_prompt_tokens >= len(shared) for r in results] == [True] * 4 + [False]


def test_parked_caches_use_idle_slots_only_and_go_least_recently_used_first():
    target = _target("kernels", torch.float32, slots=4)
    be = target.backend
    decoder = SpecDecoder(target, None)
    decoder.enable_prefix_cache(3)
    config = GenerationConfig(max_new_tokens=4, ignore_eos=True)
    prompts = [_prompt(20, seed=s) for s in range(5)]
    for p in prompts[:3]:
        decoder.generate_ids(p, config)
    assert len(be.prefix_cache) == 3
    slots = be.pool.slots
    decoder.generate_ids(prompts[0] + [1, 2], config)  # a hit: prompts[0] becomes the most recently used
    decoder.generate_ids(prompts[3], config)  # a fourth entry: the least recently used (prompts[1]) goes
    kept = [e.tokens[:20] for e in be.prefix_cache.entries]
    assert prompts[1] not in kept and prompts[0] in kept and prompts[3] in kept
    assert be.pool.slots == slots  # parked caches never made the pool grow
    # a running sequence that needs a slot takes it from the parked ones when none is free
    engine = decoder.batch_engine(slots)
    for i in range(slots):
        engine.submit(i, _prompt(20, seed=50 + i), config)  # each takes its cache at once
    assert be.pool.slots == slots and len(be.prefix_cache) == 0
    for i in range(slots):
        engine.cancel(i)


def test_an_entry_that_a_longer_one_extends_is_dropped():
    be = _target("kernels", torch.float32).backend
    be.enable_prefix_cache(8)
    short, longer = _prompt(20), _prompt(20) + _prompt(10, seed=5)
    for tokens in (short, longer):
        cache = be.new_cache()
        be.forward(cache, torch.tensor(tokens))
        be.prefix_cache.park(tokens, cache)
    assert [e.tokens for e in be.prefix_cache.entries] == [longer]
    cache = be.new_cache()
    be.forward(cache, torch.tensor(_prompt(8)))
    assert not be.prefix_cache.park(_prompt(8), cache)  # shorter than a cache block: not worth a slot
    be.release(cache)


def test_requests_that_need_every_prompt_row_prefill_the_whole_prompt():
    """Prompt logprobs score every prompt row, so such a request restores nothing (and gets the same numbers)."""
    target = _target("kernels", torch.float32)
    decoder = SpecDecoder(target, None)
    prompt = _prompt(40)
    config = GenerationConfig(max_new_tokens=4, ignore_eos=True, prompt_logprobs=1)
    want = decoder.generate(prompt, config)
    decoder.enable_prefix_cache(4)
    decoder.generate(prompt, GenerationConfig(max_new_tokens=4, ignore_eos=True))
    got = decoder.generate(prompt, config)
    assert got.metrics.cached_prompt_tokens == 0
    assert got.prompt_logprobs == want.prompt_logprobs and got.token_ids == want.token_ids


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4], 10) == 4
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4], 3) == 3
    assert common_prefix([1, 2, 9, 4], [1, 2, 3, 4], 10) == 2
    assert common_prefix([7], [1, 2], 10) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix(list(range(1000)), list(range(517)) + [0] * 10, 2000) == 517


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_an_eagle_request_restores_the_prefix_with_its_hidden_states(backend):
    """A drafter that reads the target's features gets, at the prefill, the restored rows' hidden states (kept with
    the entry) followed by the prefill's: the features a whole prefill gives, so its drafts and the output are those
    of a run without the cache."""
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head

    target = _target(backend, torch.float32, slots=2)
    torch.manual_seed(1)
    head = new_head(target.hf_model, "tiny", torch.arange(64))
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    turns = [_prompt(30, seed=s) for s in (4, 5)]

    class Recording(EagleDrafter):
        seen: list = []

        def begin(self, request):
            super().begin(request)
            self.first = True

        def observe(self, features):
            if self.first:  # the prefill's
                Recording.seen.append(features.clone())
                self.first = False
            super().observe(features)

    def converse(cached: bool):
        Recording.seen = []
        decoder = SpecDecoder(target, Recording(head, tree=True, width=2), SpeculationConfig(num_speculative_tokens=4))
        decoder.enable_prefix_cache(4 if cached else 0)
        prompt, outs, reused, drafted = [], [], [], 0
        for turn in turns:
            prompt = prompt + turn
            out, metrics = decoder.generate_ids(prompt, config)
            outs.append(out)
            reused.append(metrics.cached_prompt_tokens)
            drafted += metrics.drafted_tokens
            prompt = prompt + out
        return outs, reused, Recording.seen, drafted

    plain, _, plain_features, _ = converse(False)
    outs, reused, features, drafted = converse(True)
    assert outs == plain and drafted > 0
    assert reused[0] == 0 and reused[1] >= len(turns[0])
    assert len(features) == 2
    for a, b in zip(features, plain_features):  # bit for bit on the batch-invariant kernels; torch's may round apart
        assert torch.equal(a, b) if backend == "kernels" else torch.allclose(a, b, atol=1e-5)


def test_entries_kept_with_the_features_of_other_layers_are_not_restored_with_features():
    """An entry parked by an EAGLE-1 request keeps the final hidden states only: it serves requests whose drafter
    reads those, or none, but not one that reads the inputs of other layers (an EAGLE-3 head)."""
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head

    target = _target("kernels", torch.float32, slots=2)
    torch.manual_seed(1)
    decoder = SpecDecoder(target, EagleDrafter(new_head(target.hf_model, "tiny", torch.arange(64))),
                          SpeculationConfig(num_speculative_tokens=4))
    decoder.enable_prefix_cache(4)
    prompt = _prompt(30)
    out, _ = decoder.generate_ids(prompt, GenerationConfig(max_new_tokens=8, ignore_eos=True))
    follow_up = prompt + out + [5, 6]
    prefix = target.backend.prefix_cache
    assert prefix.claim(follow_up, (0, 1)) is None
    assert prefix.claim(follow_up, None) is not None
    claimed = prefix.claim(follow_up, ())
    assert claimed is not None and claimed[1].shape[-1] == target.info.hidden_size
