"""SpecDecoder.load: a target and a drafter by name, the draft-length policy's costs measured and the drafter warmed
up, ready to generate."""
from __future__ import annotations

from .config import SpeculationConfig
from .costs import CostModel, measure_verify_costs


def load_decoder(cls, model: str | None = None, *, drafter: str = "auto", draft_model=None, device: str = "auto",
                 dtype: str = "auto", num_speculative_tokens: int = 8, adaptive: bool = True,
                 sampling_verifier: str = "auto", chat: bool = True, trust_remote_code: bool = False,
                 backend: str = "auto", calibrate: bool = True, max_batch_for_drafting: int | None = None,
                 acceptance: str = "exact", **drafter_options):
    """SpecDecoder.load (cls: SpecDecoder): loads a target (default: the built-in smollm2-135m) and a drafter by name. max_batch_for_drafting: see
    SpeculationConfig (batched decoding drafts nothing in steps with more sequences than this). acceptance:
    "exact" (lossless) or a LOSSY rule, "top-k:K", "threshold:P" or "typical:EPS" (config.Acceptance)."""
    from .drafters import create_drafter
    from .models.loading import load_model
    from .models.registry import DEFAULT_MODEL

    speculation = SpeculationConfig(num_speculative_tokens=num_speculative_tokens, adaptive=adaptive,
                                    sampling_verifier=sampling_verifier, max_batch_for_drafting=max_batch_for_drafting,
                                    acceptance=acceptance)
    target = load_model(model or DEFAULT_MODEL, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                        backend=backend)
    made = create_drafter(drafter, target, draft_model=draft_model, trust_remote_code=trust_remote_code,
                          **drafter_options)
    costs = CostModel(measure_verify_costs(target.backend)) if calibrate and made is not None else None
    decoder = cls(target, made, speculation, chat=chat, costs=costs)
    decoder.drafter_options = {"draft_model": draft_model, "trust_remote_code": trust_remote_code, **drafter_options}
    if calibrate:
        decoder.warm_up()
    return decoder
