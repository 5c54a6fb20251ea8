"""The CPU kernels' screened LM head (kernels/argmax_screen.h): a pass asked for argmaxes only returns each row's
argmax and its logit exactly as the full head does, -inf where the maximum cannot be; greedy decoding and
speculation give the same tokens with and without it; requests that read more than the argmax get full logits."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.models.kernel_llama import KernelLlama
from specdec.models.loading import LoadedModel, model_info
from families import VARIANTS, family_model
from tiny import _NoTokenizer, loaded, tiny_llama

VOCAB, HIDDEN = 4096, 64


def _pair(model, dtype):
    """The same model on the kernels with the screen (from make_backend, the default) and without it."""
    model = model.to(dtype)
    screened = loaded(model, "kernels", dtype=dtype)
    info = model_info("tiny", model, _NoTokenizer(model), torch.device("cpu"), dtype)
    plain = LoadedModel(name="tiny", hf_model=model, tokenizer=None, backend=KernelLlama(model, info,
                                                                                        screened_head=False))
    return screened, plain


def _with_repeated_head_rows(model, distinct: int):
    """The LM head's rows made of `distinct` rows repeated: every row's maximum is tied distinct.. times over."""
    with torch.no_grad():
        head = model.lm_head.weight
        head.copy_(head[torch.arange(head.shape[0]) % distinct])
    return model


def _rows(backend, ids, prompt_len, argmax_only):
    """Logits (1 + len(ids) - prompt_len, V) of one-row passes, the passes the kernels screen: the prompt's prefill
    (its last row only), then one-token steps on the rest of ids."""
    cache = backend.new_cache()
    rows = [backend.forward(cache, ids[:prompt_len], last_only=True, argmax_only=argmax_only).logits]
    rows += [backend.forward(cache, ids[t:t + 1], argmax_only=argmax_only).logits for t in range(prompt_len, len(ids))]
    return torch.cat(rows)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), prompt_len=st.integers(1, 20), bf16=st.booleans(),
       distinct=st.sampled_from([None, 2000, 400, 40]))
def test_argmax_only_rows_keep_the_full_heads_argmax_and_its_logit(seed, prompt_len, bf16, distinct):
    model = tiny_llama(seed=seed % 7, vocab=VOCAB, hidden=HIDDEN, init_range=0.5)
    if distinct:
        model = _with_repeated_head_rows(model, distinct)
    screened, _ = _pair(model, torch.bfloat16 if bf16 else torch.float32)
    ids = torch.randint(0, VOCAB, (prompt_len + 4,), generator=torch.Generator().manual_seed(seed))
    full = _rows(screened.backend, ids, prompt_len, argmax_only=False)
    narrowed = _rows(screened.backend, ids, prompt_len, argmax_only=True)
    assert torch.isfinite(full).all()
    assert torch.equal(narrowed.argmax(-1), full.argmax(-1))  # first of equal maxima, ties included
    kept = torch.isfinite(narrowed)
    assert torch.equal(narrowed[kept], full[kept])  # bit for bit where it computed
    assert (narrowed[~kept] == float("-inf")).all()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_family_keeps_its_argmax_and_gemma_2s_capped_logits_are_not_screened(name):
    """The head tied or not, q/k norms, windows, partial RoPE: one-row passes keep the full head's argmax and logit.
    A soft-capped head (Gemma 2) is not screened: tanh can round distinct logits to one value."""
    model = family_model(name)
    target = loaded(model, "kernels")
    assert target.backend.screened_head == (model.config.model_type != "gemma2")
    ids = torch.randint(0, model.config.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
    full = _rows(target.backend, ids, 12, argmax_only=False)
    narrowed = _rows(target.backend, ids, 12, argmax_only=True)
    kept = torch.isfinite(narrowed)
    assert torch.equal(narrowed.argmax(-1), full.argmax(-1)) and torch.equal(narrowed[kept], full[kept])
    assert kept.all() if not target.backend.screened_head else (kept.sum(-1) < model.config.vocab_size).all()


def test_the_screen_narrows_rows_and_falls_back_to_the_full_head_where_it_cannot():
    """One-token steps are screened on every CPU. The prompt's pass is screened where it multiplies in float32; where
    it takes bfloat16 products (bf16_prefill: bfloat16 weights on a CPU with AVX-512 BF16, AMX or not) no pass
    screens, so the prompt's last row comes from the full head."""
    model = tiny_llama(seed=3, vocab=VOCAB, hidden=HIDDEN, init_range=0.5)
    screened, plain = _pair(model, torch.bfloat16)
    assert screened.backend.screened_head and not plain.backend.screened_head
    ids = torch.randint(0, VOCAB, (16,), generator=torch.Generator().manual_seed(0))
    kept = torch.isfinite(_rows(screened.backend, ids, 8, argmax_only=True)).sum(-1)
    narrowed = (kept >= 1) & (kept <= VOCAB // 64)  # the head's bytes were saved
    assert narrowed[1:].all(), kept.tolist()
    assert (kept[0] == VOCAB) if screened.backend.bf16_prefill else narrowed[0], kept.tolist()
    several = screened.backend.forward(screened.backend.new_cache(), ids, argmax_only=True).logits
    assert torch.isfinite(several).all()  # a pass over several rows runs the full head (kScreenedRows)
    tied = _pair(_with_repeated_head_rows(tiny_llama(seed=3, vocab=VOCAB, hidden=HIDDEN), 20), torch.bfloat16)[0]
    kept = torch.isfinite(_rows(tied.backend, ids, 8, argmax_only=True)).sum(-1)
    assert (kept == VOCAB).all()  # 205 tied maxima a row: more than the screen keeps, so the full head ran


def test_a_head_with_weights_that_are_not_finite_is_not_screened():
    """The bounds need finite weights: the kernels build no screen, and the backend says so."""
    model = tiny_llama(seed=4, vocab=VOCAB, hidden=HIDDEN, init_range=0.5)
    with torch.no_grad():
        model.lm_head.weight[7, 3] = float("inf")
    target = loaded(model, "kernels")
    assert not target.backend.screened_head
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(_rows(target.backend, ids, 8, argmax_only=True),
                               _rows(target.backend, ids, 8, argmax_only=False), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("drafter", [None, "quantized"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_are_the_same_with_and_without_the_screen(drafter, dtype):
    screened, plain = _pair(tiny_llama(seed=5, vocab=VOCAB, hidden=HIDDEN, init_range=0.5), dtype)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    spec = SpeculationConfig(num_speculative_tokens=4, adaptive=False)
    gen = torch.Generator().manual_seed(1)
    for n in (3, 17):
        prompt = torch.randint(0, VOCAB - 1, (n,), generator=gen).tolist()
        outputs = [SpecDecoder(target, create_drafter(drafter, target) if drafter else None, spec)
                   .generate_ids(prompt, config) for target in (screened, plain)]
        assert outputs[0][0] == outputs[1][0]
        if drafter:
            assert outputs[0][1].drafted_tokens > 0


@pytest.mark.parametrize("options", [dict(logprobs=3), dict(repetition_penalty=1.3), dict(temperature=0.8, seed=4),
                                     dict(prompt_logprobs=2)])
def test_requests_that_read_more_than_the_argmax_get_the_full_logits(options):
    """Logprobs, penalties, sampling and prompt logprobs read the whole row: with the screen, the same results."""
    screened, plain = _pair(tiny_llama(seed=6, vocab=VOCAB, hidden=HIDDEN, init_range=0.5), torch.float32)
    config = GenerationConfig.create(max_new_tokens=12, ignore_eos=True, **options)
    prompt = [5, 9, 100, 7, 5, 9]
    runs = [SpecDecoder(target, NgramDrafter(1, 3)).complete(prompt, config) for target in (screened, plain)]
    assert runs[0].generated == runs[1].generated
    assert runs[0].logprobs == runs[1].logprobs
    assert runs[0].prompt_logprobs == runs[1].prompt_logprobs
    assert not runs[0].argmax_only


def test_a_greedy_request_without_adjustments_reads_argmaxes_only():
    screened, _ = _pair(tiny_llama(seed=6, vocab=VOCAB, hidden=HIDDEN), torch.float32)
    state = SpecDecoder(screened, None).complete([1, 2, 3], GenerationConfig(max_new_tokens=2, ignore_eos=True))
    assert state.argmax_only
