"""Loads a SpecDecoder for serving: the target's KV pool (and a draft model's) sized for the whole batch.

`SpecDecoder.load` sizes pools for one sequence; a pool that grows one slot at a time copies itself
each time (for a 135M model at 8k context, 377 MB a slot), which would land inside the first busy
minutes of a server. The pool is zeroed when it is made, so all of it is resident from the start (a pool too
large for the machine fails at start, and memory does not grow under load): `max_context` bounds it (32 slots of
smollm2-135m's 8k context in float32 are 12 GB).
"""
from __future__ import annotations


def load_decoder(model: str, *, slots: int, drafter: str = "auto", draft_model: str | None = None,
                 device: str = "auto", dtype: str = "auto", backend: str = "auto", num_speculative_tokens: int = 8,
                 adaptive: bool = True, sampling_verifier: str = "auto", trust_remote_code: bool = False,
                 max_batch_for_drafting: int | None = None, acceptance: str = "exact", max_context: int | None = None,
                 graphs: str = "auto", **drafter_options):
    """A SpecDecoder whose backends hold `slots` sequences; verify costs are always measured, since any
    request may ask for a drafter (ngram) even when the server's default is none. max_batch_for_drafting: steps
    with more running sequences than this draft nothing (SpeculationConfig). acceptance: "exact" (lossless) or a
    LOSSY rule for every request that drafts (config.Acceptance). max_context: the most tokens a sequence holds
    (prompt, output, drafts), at most the model's context (default: the model's). graphs: the target's passes as
    CUDA graphs (models/loading.py make_backend; a draft model takes them where its backend can)."""
    from ..costs import CostModel, measure_verify_costs
    from ..config import SpeculationConfig
    from ..drafters import create_drafter
    from ..engine import SpecDecoder
    from ..errors import ConfigError
    from ..models.loading import load_model

    speculation = SpeculationConfig(num_speculative_tokens=num_speculative_tokens, adaptive=adaptive,
                                    sampling_verifier=sampling_verifier, max_batch_for_drafting=max_batch_for_drafting,
                                    acceptance=acceptance)
    target = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, backend=backend,
                        slots=slots, max_context=max_context, graphs=graphs)
    if max_context and max_context > target.info.max_context:
        raise ConfigError(f"--max-context {max_context} is beyond the model's context of {target.info.max_context} "
                          "tokens")
    draft = None
    if draft_model:
        draft = load_model(draft_model, device=str(target.info.device), dtype=str(target.info.dtype).split(".")[-1],
                           trust_remote_code=trust_remote_code, slots=slots, max_context=max_context)
    made = create_drafter(drafter, target, draft_model=draft, trust_remote_code=trust_remote_code, **drafter_options)
    costs = CostModel(measure_verify_costs(target.backend))
    decoder = SpecDecoder(target, made, speculation, costs=costs)
    decoder.warm_up()
    return decoder
