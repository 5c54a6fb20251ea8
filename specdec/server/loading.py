"""Loads a SpecDecoder for serving, through SpecDecoder.load: the target's KV pool (and a draft model's) sized for the
whole batch.

By default `SpecDecoder.load` sizes pools for one sequence; a pool that grows one slot at a time copies itself
each time (for a 135M model at 8k context, 377 MB a slot), which would land inside the first busy
minutes of a server. The torch backend zeroes its pool when it is made, so all of it is resident from the start (a
pool too large for the machine fails at start); the kernels' pool lies on pages that become resident as sequences
first write them, up to its whole size. `max_context` bounds it (32 slots of smollm2-135m's 8k context in float32
are 12 GB).
"""

from __future__ import annotations


def load_decoder(
    model: str,
    *,
    slots: int,
    drafter: str = "auto",
    draft_model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    backend: str = "auto",
    num_speculative_tokens: int = 8,
    adaptive: bool = True,
    sampling_verifier: str = "auto",
    trust_remote_code: bool = False,
    max_batch_for_drafting: int | None = None,
    acceptance: str = "exact",
    max_context: int | None = None,
    graphs: str = "auto",
    compile: str = "auto",
    **drafter_options,
):
    """A SpecDecoder whose backends hold `slots` sequences; verify costs are always measured, since any
    request may ask for a drafter (ngram) even when the server's default is none. max_batch_for_drafting: steps
    with more running sequences than this draft nothing (SpeculationConfig). acceptance: "exact" (lossless) or a
    LOSSY rule for every request that drafts (config.Acceptance). max_context: the most tokens a sequence holds
    (prompt, output, drafts), at most the model's context (default: the model's). graphs: the target's passes as
    CUDA graphs, compile: those compiled by torch.compile (models/backend_choice.py make_backend)."""
    from ..engine import SpecDecoder

    decoder = SpecDecoder.load(
        model,
        drafter=drafter,
        draft_model=draft_model,
        device=device,
        dtype=dtype,
        backend=backend,
        num_speculative_tokens=num_speculative_tokens,
        adaptive=adaptive,
        sampling_verifier=sampling_verifier,
        trust_remote_code=trust_remote_code,
        max_batch_for_drafting=max_batch_for_drafting,
        acceptance=acceptance,
        slots=slots,
        max_context=max_context,
        time_target=True,
        graphs=graphs,
        compile=compile,
        **drafter_options,
    )
    decoder.drafter_options = {}  # requests' drafters by name take the server's options (EngineWorker)
    return decoder
