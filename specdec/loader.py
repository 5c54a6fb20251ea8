"""SpecDecoder.load: a target and a drafter by name, the draft-length policy's costs measured and the drafter warmed
up, ready to generate."""

from __future__ import annotations

from dataclasses import replace

from .choice import DrafterChoice
from .config import Acceptance, GenerationConfig
from .speculation_config import SpeculationConfig
from .costs import CostModel, measure_verify_costs

WARM_UP_PROMPT = "List the days of the week, then the months of the year."


def load_decoder(
    cls,
    model: str | None = None,
    *,
    drafter: str = "auto",
    draft_model=None,
    device: str = "auto",
    dtype: str = "auto",
    num_speculative_tokens: int = 8,
    adaptive: bool = True,
    sampling_verifier: str = "auto",
    chat: bool = True,
    trust_remote_code: bool = False,
    backend: str = "auto",
    calibrate: bool = True,
    max_batch_for_drafting: int | None = None,
    acceptance: str = "exact",
    slots: int = 1,
    max_context: int | None = None,
    time_target: bool = False,
    graphs: str = "auto",
    compile: str = "auto",
    dequantize: bool = False,
    **drafter_options,
):
    """SpecDecoder.load (cls: SpecDecoder): loads a target (default: the built-in smollm2-135m) and a drafter by
    name. max_batch_for_drafting: see SpeculationConfig (batched decoding drafts nothing in steps with more
    sequences than this). acceptance: "exact" (lossless) or a LOSSY rule, "top-k:K", "threshold:P" or
    "typical:EPS" (config.Acceptance). slots: the sequences the KV pools hold from the start (a server's batch);
    max_context: the most tokens a sequence holds (prompt, output, drafts), at most the model's context (default:
    the model's); time_target: measure the target's verify costs even without a drafter (calls may pick one by
    name later: a server's requests), where calibrate is on; graphs: the target's decode and verify passes as CUDA
    graphs (auto, on, off: models/backend_choice.py make_backend); compile: those passes compiled by torch.compile (auto,
    on, off: the same); dequantize: a GGUF file's weights as floats instead of in its quantized formats."""
    from .drafters import create_drafter
    from .errors import ConfigError
    from .models.loading import load_model
    from .models.registry import DEFAULT_MODEL

    speculation = SpeculationConfig(
        num_speculative_tokens=num_speculative_tokens,
        adaptive=adaptive,
        sampling_verifier=sampling_verifier,
        max_batch_for_drafting=max_batch_for_drafting,
        acceptance=Acceptance.parse(acceptance),
    )
    target = load_model(
        model or DEFAULT_MODEL,
        device=device,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        backend=backend,
        slots=slots,
        max_context=max_context,
        graphs=graphs,
        compile=compile,
        dequantize=dequantize,
    )
    if max_context and max_context > target.info.max_context:
        raise ConfigError(
            f"--max-context {max_context} is beyond the model's context of {target.info.max_context} tokens"
        )
    draft = draft_model
    if isinstance(draft_model, str) and draft_model and (slots != 1 or max_context is not None):  # pools as sized
        draft = load_model(
            draft_model,
            device=str(target.info.device),
            dtype=str(target.info.dtype).split(".")[-1],
            trust_remote_code=trust_remote_code,
            slots=slots,
            max_context=max_context,
        )
    made = create_drafter(drafter, target, draft_model=draft, trust_remote_code=trust_remote_code, **drafter_options)
    timed = calibrate and (made is not None or time_target)
    costs = CostModel(measure_verify_costs(target.backend)) if timed else None
    decoder = cls(target, made, speculation, chat=chat, costs=costs)
    decoder.drafter_options = {"draft_model": draft_model, "trust_remote_code": trust_remote_code, **drafter_options}
    if calibrate:
        decoder.warm_up()
    return decoder


def warm_up_drafter(decoder, drafter, max_new_tokens: int = 16) -> None:
    """Runs a short generation twice on `decoder` (a SpecDecoder) with `drafter` forced to draft: the first run pays
    the drafter's first-call costs (allocations, kernel selection), the second measures its cost per drafted
    position, so the draft-length policy starts from a warm figure. The runs are no request's: they teach no drafter
    (Drafter.learn) and no trace records them. Nothing to do without a drafter, or without room for it in a short
    context."""
    if drafter is None:
        return
    ids = decoder.encode(WARM_UP_PROMPT)
    if len(ids) + max_new_tokens + decoder.speculation.num_speculative_tokens + 1 > decoder.target.info.max_context:
        return
    forced = replace(decoder.speculation, adaptive=False)
    for _ in range(2):
        decoder.costs.for_drafter(drafter.name).reset_draft()
        decoder.complete(
            ids,
            GenerationConfig(max_new_tokens=max_new_tokens),
            DrafterChoice(drafter),
            forced,
            learn=False,
            traced=False,
        )
