"""The sampler chain as pure tensor functions: logits -> filtered logits -> probabilities -> token.

The same chain forms the target's distribution p and a draft model's q, so verification compares
like with like. Greedy decoding (temperature 0) never calls these; it takes the argmax of the logits
(after the penalties of penalties.py, where a request asks for them).
"""

from __future__ import annotations

import torch

from .config import SamplingConfig


def tempered_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in float32, shifted so the best logit is 0: (..., V) -> (..., V).

    The shift comes before the division: a tiny temperature then sends the others to -inf, not the best ones to
    +inf, whose differences (inf - inf) would make softmax NaN. A temperature below float32's smallest normal
    number (5e-324 is 0 there: 0 / 0) divides as that number, with the same limit.
    """
    x = logits.float()
    return (x - x.amax(-1, keepdim=True)) / max(temperature, torch.finfo(torch.float32).tiny)


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Applies temperature, then top-k, top-p and min-p, in float32; filtered entries become -inf.

    logits: (..., V). Returns (..., V) float32.
    Example: logits [2, 1, 0], temperature 1, top_k 2 -> [2, 1, -inf].
    """
    x = tempered_logits(logits, cfg.temperature)
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = sorted_x.softmax(-1)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # (..., V): probability of strictly better tokens
        drop_sorted = mass_before >= cfg.top_p
        drop_sorted[..., 0] = False  # the best token stays, also for a top_p that is 0 in float32 (5e-324)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    if cfg.min_p > 0.0:  # drops tokens less likely than min_p times the likeliest one
        p = x.softmax(-1)
        x = x.masked_fill(p < cfg.min_p * p.amax(-1, keepdim=True), float("-inf"))
    return x


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Sampling distribution: (..., V) logits -> (..., V) float32 probabilities summing to 1."""
    return warp_logits(logits, cfg).softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draws one token per row: probs (..., V) -> (...) int64."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs (V,), drawn on the generator's device."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded with `seed`, or from fresh entropy when seed is None."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def position_gumbel(
    seed: int, positions: list[int], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Gumbel noise that depends only on (seed, position): (len(positions), V) float32.

    argmax(log p + noise) is an exact sample from p, and because the noise at a position does not
    depend on how tokens were produced, decoding with and without speculation draws the same sample.
    """
    rows = []
    for pos in positions:
        gen = torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + pos * 7_919 + 17) % (2**63))
        u = torch.rand(vocab_size, generator=gen, dtype=torch.float64).clamp_(min=1e-300)
        rows.append(-torch.log(-torch.log(u)))
    return torch.stack(rows).float().to(device, non_blocking=True)  # a copy that does not wait on the device
