"""One request while it decodes: its tokens, when it stops, its text, its logprobs and its metrics; and its KV
cache and drafter from its start to its end (open_request, close_request).

The scheduler (scheduler.py) runs the steps: it asks the drafter, runs the target, verifies the drafts and rolls
the KV cache back, then hands each step's outcome here. A Request records it and never calls a model: it appends
the tokens up to EOS, the length limit or the end of a constrained text, turns them into text when asked (text.py;
the first stop string ends the request there), and keeps the request's logprobs and metrics.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .config import EXACT, GenerationConfig
from .speculation_config import SpeculationConfig
from .drafters.base import Drafter, DraftRequest
from .errors import ConfigError, ContextLengthError
from .logits import LogitsProcessor
from .logprobs import TokenLogprob, logprob_logits, prompt_logprobs, token_logprobs
from .metrics import GenerationMetrics
from .costs import CostModel
from .policy import DraftLengthPolicy
from .request_prefix import claim_prefix, park
from .sampling import make_generator, position_gumbel
from .text import TextAssembler
from .verify import Draft


class Request:
    """Invariant between steps: the target's cache (`cache`, given by the scheduler) holds every token but the last."""

    def __init__(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        info,
        drafter: Drafter | None,
        speculation: SpeculationConfig,
        costs: CostModel,
        learn: bool = True,
        tokenizer=None,
        tracer=None,
    ):
        """info: the target's ModelInfo. costs: the engine's CostModel, where this request's kind of drafter keeps its
        drafting cost. learn: hand the output to the drafter when the request ends (Drafter.learn); off for warm-up
        runs. tokenizer: the target's, for text and a structured-output constraint. tracer: a TraceWriter
        (specdec/trace.py) that records the request when it ends."""
        self.tokens = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.config = config
        self.drafter = drafter
        self.k_max = speculation.num_speculative_tokens if drafter is not None else 0
        self.adaptive = speculation.adaptive
        if self.prompt_len == 0:
            raise ConfigError("the prompt is empty")
        if self.prompt_len + config.max_new_tokens + self.k_max + 1 > info.max_context:
            room = f" and room for {self.k_max + 1} draft tokens" if self.k_max else ""
            what = (
                f"the prompt ({self.prompt_len} tokens)"
                if self.prompt_len + 2 > info.max_context
                else f"the prompt ({self.prompt_len} tokens) plus max_new_tokens ({config.max_new_tokens}){room}"
            )
            raise ContextLengthError(f"{what} exceeds the context of {info.max_context} tokens")
        sampling = config.sampling
        if sampling.logit_bias and max(t for t, _ in sampling.logit_bias) >= info.vocab_size:
            raise ConfigError(f"logit_bias names a token id outside the vocabulary [0, {info.vocab_size})")
        self.vocab_size, self.device, self.max_context = info.vocab_size, info.device, info.max_context
        self.logprobs: list[TokenLogprob] | None = [] if config.logprobs is not None else None  # one per output token
        self.prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token, after the prefill if asked for
        wanted = sampling.penalized or config.constraint is not None  # else the logits are used as they come
        self.logits_processor = LogitsProcessor(prompt_ids, config, info, tokenizer) if wanted else None
        self.seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        self.generator = None if sampling.greedy else make_generator(self.seed)  # rejection sampling's draws
        self.coupled = not sampling.greedy and speculation.verifier_for(sampling) == "coupled"
        self.eos = () if config.ignore_eos else info.eos_token_ids
        self.costs: CostModel | None = None  # its kind of drafter's own drafting cost
        self.policy: DraftLengthPolicy | None = None
        if drafter is not None:
            self.costs = costs.for_drafter(drafter.name)
            self.policy = DraftLengthPolicy(self.k_max, self.costs, adaptive=self.adaptive)
        layers = drafter.feature_layers if drafter is not None else None
        self.needs_features = layers is not None  # Drafter.observe
        self.feature_layers = tuple(layers) if layers is not None else ()  # its drafter's layout
        self.needs_scores = drafter is not None and drafter.needs_scores  # Drafter.scored after each verify
        self.features: list[torch.Tensor] | None = None  # hidden rows kept for the prefix cache (the scheduler's)
        self.features_given = 0  # prompt rows its drafter has observed (a prompt's prefill may come in chunks)
        self.cache: Any = None  # the KV cache (a model's SequenceCache) the scheduler holds for it, None once it ended
        self.acceptance = speculation.acceptance if drafter is not None else EXACT  # nothing drafted: exact
        self.metrics = GenerationMetrics(prompt_tokens=self.prompt_len, acceptance=str(self.acceptance))
        # whether the target's rows for it are read for their argmax alone (CausalLM.forward's argmax_only)
        self.argmax_only = (
            sampling.greedy
            and self.logits_processor is None
            and self.logprobs is None
            and config.prompt_logprobs is None
            and not self.acceptance.lossy
        )
        self.finished = ""  # "stop" (EOS, a stop string, a complete constrained text) or "length"
        self.started_at = time.perf_counter()
        self.learn = learn
        self.tracer = tracer
        self.step_log: list[list[int]] | None = [] if tracer is not None else None  # [drafted, accepted] per step
        self.text = TextAssembler(tokenizer, config.stop)  # fed by take_text, for callers that want text

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def prefill_all_logits(self) -> bool:
        """Whether the prefill must return every prompt row's logits (for prompt logprobs), not the last one's."""
        return self.config.prompt_logprobs is not None

    def draft_cap(self) -> int:
        """Most drafts worth proposing: a step emits at most k + 1 tokens."""
        return min(self.k_max, self.config.max_new_tokens - len(self.generated) - 1)

    def noise(self, positions: list[int]) -> torch.Tensor:
        """Gumbel noise fixed by (seed, position), for coupled sampling: (len(positions), V)."""
        return position_gumbel(self.seed, positions, self.vocab_size, self.device)

    def noise_ahead(self) -> Callable[[list[int]], torch.Tensor] | None:
        """For coupled sampling, depths past the context -> their rows' noise (what verify takes); else None."""
        if not self.coupled:
            return None
        position = len(self.tokens)
        return lambda depths: self.noise([position + d for d in depths])

    # ---- what each step decided ----------------------------------------------------------------------
    def take_prompt_logprobs(self, logits: torch.Tensor) -> None:
        """logits (prompt length, V) of every prompt row, from a prefill that returned them all."""
        alternatives = self.config.prompt_logprobs or 0  # asked for, or this pass would not have returned every row
        self.prompt_logprobs = prompt_logprobs(logits[:-1], self.tokens[: self.prompt_len], alternatives)

    def take_first(self, token: int, raw: torch.Tensor, processed: torch.Tensor, seconds: float) -> list[int]:
        """The token chosen after the prefill, from its last row's logits (1, V), raw and processed (logits.py)."""
        self.metrics.prefill_time_s = seconds
        return self._emit([token], raw, processed)

    def take_step(
        self, draft: Draft, path: list[int], token: int, raw: torch.Tensor, processed: torch.Tensor, seconds: float
    ) -> list[int]:
        """A verified step: the draft's accepted path (node indices) and the next token, from the scored rows'
        logits (1 + k, V), raw and processed; seconds: the target pass. Returns the tokens emitted."""
        self.metrics.verify_time_s += seconds
        if self.step_log is not None:
            self.step_log.append([len(draft), len(path)])
        accepted = draft.tokens[path].tolist() if path else []  # an empty index would cost a plain step 50 µs
        new = self._emit(accepted + [token], raw, processed, [0] + [i + 1 for i in path])
        count_step_metrics(self.metrics, drafted=len(draft), accepted=len(path), emitted=len(new), source=draft.source)
        return new

    def _emit(
        self, tokens: list[int], raw: torch.Tensor, processed: torch.Tensor, rows: list[int] | None = None
    ) -> list[int]:
        """Appends the tokens a step chose and records their logprobs; rows[j] (default j) of the logits holds the
        distribution tokens[j] was chosen from."""
        new = self.append(tokens)
        if self.logprobs is not None:
            scored = logprob_logits(raw, processed, self.config.logprobs_mode, self.config.sampling)
            alternatives = self.config.logprobs or 0  # a list of logprobs means they were asked for
            self.logprobs += token_logprobs(scored if rows is None else scored[rows[: len(new)]], new, alternatives)
        self.metrics.new_tokens += len(new)
        return new

    def append(self, new: list[int]) -> list[int]:
        """Appends tokens up to the first EOS, the end of a constrained text or the length limit; marks the request
        finished there."""
        kept, processor = [], self.logits_processor
        for token in new:
            kept.append(token)
            if token in self.eos or (processor is not None and processor.ends_text(token)):
                self.finished = "stop"
                break
            if len(self.generated) + len(kept) >= self.config.max_new_tokens:
                self.finished = "length"
                break
        self.tokens.extend(kept)
        if processor is not None:
            processor.extend(kept)
        return kept

    # ---- text and the end -----------------------------------------------------------------------------
    def take_text(self, new: list[int]) -> tuple[str, bool]:
        """(text delta of a step's new tokens, whether a stop string ended the request there): the one place stop
        strings end a request (the tokens after one are dropped)."""
        delta, kept = self.text.add(new)
        if kept is not None:
            dropped = len(new) - kept
            if dropped:
                del self.tokens[-dropped:]
                if self.logprobs is not None:
                    del self.logprobs[-dropped:]
            self.finished = "stop"
        return delta, kept is not None

    def flush_text(self) -> str:
        """The text held back (a possible start of a stop string) once the request has ended."""
        return self.text.flush()

    def finish(self, reason: str) -> None:
        """Records the end of the request: its total time, and why it ended (its own reason, else `reason`)."""
        self.metrics.total_time_s = time.perf_counter() - self.started_at
        self.metrics.finish_reason = self.finished or reason


def count_step_metrics(
    m: GenerationMetrics, drafted: int, accepted: int, emitted: int, source: str | None = None
) -> None:
    """Counts one verify step into m: `drafted` proposals, the first `accepted` of them kept, `emitted` tokens
    output; source: the drafter a selector chose for it."""
    m.steps += 1
    m.drafting_steps += drafted > 0
    if source is not None:
        m.drafter_steps[source] = m.drafter_steps.get(source, 0) + 1
    m.step_tokens += emitted
    m.drafted_tokens += drafted
    m.accepted_tokens += accepted
    grow = drafted - len(m.drafted_per_position)
    if grow > 0:
        m.drafted_per_position.extend([0] * grow)
        m.accepted_per_position.extend([0] * grow)
    for i in range(drafted):
        m.drafted_per_position[i] += 1
    for i in range(accepted):
        m.accepted_per_position[i] += 1


def pass_feature_layers(requests: list[Request]) -> tuple[int, ...] | None:
    """The feature layers one target pass returns for `requests`: those their drafters read, in order of first ask
    (each request then takes its own layout: features_in_layout); None where no drafter reads features."""
    readers = [r for r in requests if r.needs_features]
    return tuple(dict.fromkeys(i for r in readers for i in r.feature_layers)) if readers else None


# ---- a request's KV cache and drafter, from its start to its end ------------------------------------------
def open_request(backend, request: Request) -> Request:
    """Gives a request its KV cache, a prefix restored from the backend's prefix cache where an earlier request
    began as this one does, else a fresh slot; and starts its drafter."""
    prefix = backend.prefix_cache
    if request.needs_features and prefix is not None:
        request.features = []  # the hidden rows, which a drafter reading features needs from a restored prefix
    claimed = claim_prefix(prefix, request) if prefix is not None else None
    request.cache = claimed or backend.new_cache()
    request.metrics.cached_prompt_tokens = request.cache.length
    if request.drafter is not None:
        generator = None if request.generator is None else make_generator(request.seed + 1)  # its draws, sampling
        request.drafter.begin(
            DraftRequest(
                prompt_ids=request.tokens[: request.prompt_len],
                sampling=request.config.sampling,
                generator=generator,
                noise=request.noise if request.coupled else None,
                costs=request.costs,
                adaptive=request.adaptive,
                target_cache=request.cache,
            )
        )
    return request


def close_request(backend, request: Request, reason: str) -> None:
    """Ends a request (BatchEngine._end, the one caller, ends each once): its drafter learns the output and ends,
    its cache goes to the prefix cache or is freed, and the trace records it."""
    request.finish(reason)
    drafter = request.drafter
    if drafter is not None:
        if request.learn:
            drafter.learn(request.generated)
        drafter.end()
    prefix = backend.prefix_cache
    if prefix is None or not park(prefix, backend, request):
        backend.release(request.cache)
    request.cache = None
    if request.tracer is not None and request.generated:
        request.tracer.write(request)
