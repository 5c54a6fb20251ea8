"""The EAGLE head itself: a bfloat16 head keeps float32 RoPE frequencies, its CPU-kernel products compute what the
torch head does (prompt, a masked tree level, causal accepted pairs), and a head the kernels cannot run is named
with the reason."""
import pytest
import torch

from specdec.drafters.heads.eagle_head import new_head
from tiny import kernel_head, tiny_llama


def _random_head(target, seed: int):
    """A head over a draft vocabulary of 40 tokens, every weight drawn from N(0, 0.1) instead of a new head's
    initialization, so that each part of it shows in its outputs."""
    torch.manual_seed(seed)
    head = new_head(target, "tiny", torch.arange(40))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    return head


def test_a_bfloat16_head_keeps_float32_rope_frequencies(eagle_target):
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
    exact = head.inv_freq.clone()
    head = head.to(torch.bfloat16)
    assert head.fc.weight.dtype == torch.bfloat16 and head.embed.dtype == torch.bfloat16
    assert head.inv_freq.dtype == torch.float32 and torch.equal(head.inv_freq, exact)


def test_the_kernel_head_computes_what_the_torch_head_does(eagle_target):
    """Prompt pairs, a tree level under a mask, then accepted pairs after the prompt (causal), through both: the
    same hidden states, keys and logits (float32)."""
    head = _random_head(eagle_target, seed=4)
    fast = kernel_head(head)
    H = eagle_target.config.hidden_size
    feats, tokens, positions = torch.randn(1, 9, H), torch.randint(0, 64, (1, 9)), torch.arange(9)[None]
    level = torch.randn(1, 3, H), torch.tensor([[4, 5, 6]]), torch.full((1, 3), 9)
    mask = torch.ones(1, 1, 3, 12, dtype=torch.bool)
    mask[0, 0, :, 9:] = torch.eye(3, dtype=torch.bool)  # siblings see the prompt and themselves
    with torch.no_grad():
        want, want_kv = head(feats, tokens, positions)
        got, got_kv = fast(feats, tokens, positions)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_kv, want_kv, atol=1e-5, rtol=1e-5)
        want2, _ = head(*level, past=want_kv, mask=mask)
        got2, _ = fast(*level, past=got_kv, mask=mask)
        torch.testing.assert_close(got2, want2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast.draft_logits(got2), head.draft_logits(want2), atol=1e-5, rtol=1e-5)
        more = torch.randn(1, 2, H), torch.tensor([[7, 8]]), torch.tensor([[9, 10]])  # accepted pairs: causal
        want3, want3_kv = head(*more, past=want_kv)
        got3, got3_kv = fast(*more, past=got_kv)
        torch.testing.assert_close(got3, want3, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got3_kv, want3_kv, atol=1e-5, rtol=1e-5)


def test_the_kernel_head_reads_a_past_held_in_a_longer_buffer_as_a_copy_of_it(eagle_target):
    """The drafter keeps the head's keys and values in a buffer longer than the past (HeadCache), rows past it
    holding other drafts: the kernels read the first rows in place, heads a capacity apart, and compute what they
    compute from a contiguous copy of those rows, bit for bit."""
    from specdec.drafters.heads.eagle_device import HeadCache

    head = _random_head(eagle_target, seed=6)
    fast = kernel_head(head)
    assert head.config.num_kv_heads > 1  # else the heads' stride would not show
    H = eagle_target.config.hidden_size
    feats, tokens, positions = torch.randn(1, 9, H), torch.randint(0, 64, (1, 9)), torch.arange(9)[None]
    level = torch.randn(1, 3, H), torch.tensor([[4, 5, 6]]), torch.full((1, 3), 9)
    with torch.no_grad():
        _, kv = fast(feats, tokens, positions)
        cache = HeadCache(head.config, torch.device("cpu"), torch.float32, capacity=16)
        cache.append(kv)
        cache.write(9, tuple(torch.randn(1, head.config.num_kv_heads, 7, head.config.head_dim) for _ in range(2)))
        in_place = fast(*level, past=cache.past())
        copied = fast(*level, past=tuple(t.contiguous() for t in cache.past()))
    assert not cache.past()[0].is_contiguous()
    assert torch.equal(in_place[0], copied[0]) and torch.equal(in_place[1][0], copied[1][0])


def test_heads_the_kernels_cannot_run_are_named_with_the_reason():
    """A head whose head dim the kernels' attention cannot read 16 lanes at a time drafts in torch instead."""
    from specdec.drafters.heads.eagle_kernels import kernel_head_problem

    target = tiny_llama(seed=0, hidden=64, heads=8, kv_heads=2)  # head dim 8
    config = new_head(target, "tiny", torch.arange(target.config.vocab_size)).config
    assert kernel_head_problem(config) == "head dim 8 not a multiple of 16"


def test_an_8_bit_kernel_head_rounds_as_the_quantized_products_do_and_stays_batch_invariant(eagle_target):
    """Over a quantized GGUF target the kernels keep a head's weights in 8-bit groups (head_bits): its products are
    the kernels' quantized products of the same weights (bit for bit), its outputs stay within 8-bit rounding of
    the float head's, and a row's output does not depend on the rows beside it."""
    from types import SimpleNamespace

    from specdec.drafters.heads.eagle_kernels import KernelEagleHead, head_bits, kernel_head_problem
    from specdec.kernels import load

    head = _random_head(eagle_target, seed=5)
    if kernel_head_problem(head.config):
        pytest.skip(kernel_head_problem(head.config))
    assert head_bits(SimpleNamespace(backend=SimpleNamespace(quantized_weights=True)), head.config) == 8
    assert head_bits(SimpleNamespace(backend=SimpleNamespace(quantized_weights=False)), head.config) == 0
    fast, exact = KernelEagleHead(head, bits=8), kernel_head(head)
    H = eagle_target.config.hidden_size
    feats, tokens, positions = torch.randn(1, 6, H), torch.randint(0, 64, (1, 6)), torch.arange(6)[None]
    with torch.no_grad():
        hidden = torch.randn(5, H)
        assert torch.equal(fast.draft_logits(hidden), load().quantized_matmul(hidden, head.draft_lm_head, 8))
        got, got_kv = fast(feats, tokens, positions)
        want, _ = exact(feats, tokens, positions)
        assert (got - want).norm() < 0.05 * want.norm()
        rows = [fast(feats[:, : i + 1], tokens[:, : i + 1], positions[:, : i + 1])[0][0, -1] for i in range(6)]
        assert torch.equal(torch.stack(rows), got[0])  # each row alone, causal: the same numbers
        logits = fast.draft_logits(got[0])
        assert torch.equal(torch.cat([fast.draft_logits(got[0, i : i + 1]) for i in range(6)]), logits)
