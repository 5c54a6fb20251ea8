"""The step loop: draft -> verify in one target forward -> accept or roll back -> observe.

`SpecDecoder` loads a target once and generates or streams many prompts. With drafter None the
same loop is plain autoregressive decoding (the baseline), so both run the same code.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .adaptive import CostModel, DraftLengthPolicy, measure_verify_costs
from .config import GenerationConfig, SpeculationConfig
from .detokenize import IncrementalDetokenizer, StopStrings
from .drafters.base import Draft, Drafter, DraftRequest
from .errors import ConfigError, ContextLengthError
from .metrics import GenerationMetrics
from .sampling import make_generator, position_gumbel, probs_from_logits
from .verify import coupled_verify, greedy_verify, rejection_verify


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated tokens, the final EOS included
    prompt_ids: list[int]
    metrics: GenerationMetrics
    finish_reason: str  # "stop" (EOS or a stop string) or "length"


@dataclass
class _Sequence:
    """Mutable state of one request while it decodes."""

    tokens: list[int]  # prompt + generated; the target cache holds all but the last
    prompt_len: int
    config: GenerationConfig
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)
    finished: str = ""

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]


class SpecDecoder:
    """Lossless speculative decoding over one target model and one drafter."""

    def __init__(self, target, drafter: Drafter | None = None, speculation: SpeculationConfig | None = None,
                 chat: bool = True, costs: CostModel | None = None):
        self.target = target  # LoadedModel
        self.drafter = drafter
        self.speculation = speculation or SpeculationConfig()
        self.chat = chat
        self.costs = costs or CostModel()

    @classmethod
    def load(cls, model: str | None = None, *, drafter: str = "auto", draft_model=None, device: str = "auto",
             dtype: str = "auto", num_speculative_tokens: int = 8, adaptive: bool = True,
             sampling_verifier: str = "rejection", chat: bool = True, trust_remote_code: bool = False,
             backend: str = "auto", calibrate: bool = True, **drafter_options) -> "SpecDecoder":
        """Loads a target (default: the built-in smollm2-135m) and a drafter by name."""
        from .drafters import create_drafter
        from .models.loading import load_model
        from .models.registry import DEFAULT_MODEL

        speculation = SpeculationConfig(num_speculative_tokens=num_speculative_tokens, adaptive=adaptive,
                                        sampling_verifier=sampling_verifier)
        target = load_model(model or DEFAULT_MODEL, device=device, dtype=dtype,
                            trust_remote_code=trust_remote_code, backend=backend)
        made = create_drafter(drafter, target, draft_model=draft_model, trust_remote_code=trust_remote_code,
                              **drafter_options)
        costs = CostModel(measure_verify_costs(target.backend)) if calibrate and made is not None else None
        return cls(target, made, speculation, chat=chat, costs=costs)

    # ---- prompts ------------------------------------------------------------------------------
    def encode(self, prompt) -> list[int]:
        """Token ids for a prompt: a string (through the chat template when chat is on), messages, or ids."""
        tokenizer = self.target.tokenizer
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, str) and not (self.chat and tokenizer.chat_template):
            return tokenizer(prompt, add_special_tokens=True)["input_ids"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if not tokenizer.chat_template:
            raise ConfigError("this model's tokenizer has no chat template; pass a plain string with chat off")
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    # ---- public generation API ---------------------------------------------------------------
    def generate(self, prompt, config: GenerationConfig | None = None, **kwargs) -> GenerationResult:
        """Generates a whole completion. kwargs: max_new_tokens, temperature, top_k, top_p, seed, stop."""
        stream = self.stream(prompt, config, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt, config: GenerationConfig | None = None, **kwargs) -> "TextStream":
        """An iterator of text deltas; `.result` holds the GenerationResult once it is exhausted."""
        cfg = config or GenerationConfig.create(**kwargs)
        return TextStream(self, self.encode(prompt), cfg)

    def generate_ids(self, prompt_ids: list[int], config: GenerationConfig) -> tuple[list[int], GenerationMetrics]:
        """Token-level generation without text handling (no stop strings): (generated ids, metrics)."""
        seq = _Sequence(tokens=list(prompt_ids), prompt_len=len(prompt_ids), config=config)
        for _ in self.decode(seq):
            pass
        return seq.generated, seq.metrics

    # ---- the loop -----------------------------------------------------------------------------
    def decode(self, seq: _Sequence) -> Iterator[list[int]]:
        """Runs the step loop for one sequence, yielding each step's new tokens."""
        cfg = seq.config
        info = self.target.info
        k_max = self.speculation.num_speculative_tokens if self.drafter is not None else 0
        needed = seq.prompt_len + cfg.max_new_tokens + k_max + 1
        if needed > info.max_context:
            raise ContextLengthError(f"prompt ({seq.prompt_len} tokens) plus max_new_tokens ({cfg.max_new_tokens}) "
                                     f"exceeds the model's context of {info.max_context} tokens")
        if seq.prompt_len == 0:
            raise ConfigError("the prompt is empty")
        backend = self.target.backend
        sampling = cfg.sampling
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        generator = make_generator(seed)
        coupled = not sampling.greedy and self.speculation.sampling_verifier == "coupled"

        def noise(positions: list[int]) -> torch.Tensor:
            return position_gumbel(seed, positions, info.vocab_size, info.device)

        policy = DraftLengthPolicy(k_max, self.costs, adaptive=self.speculation.adaptive)
        cache = backend.new_cache()
        if self.drafter is not None:
            self.drafter.begin(DraftRequest(prompt_ids=seq.tokens[: seq.prompt_len], sampling=sampling,
                                            generator=make_generator(seed + 1), noise=noise if coupled else None))
        metrics = seq.metrics
        metrics.prompt_tokens = seq.prompt_len
        started = time.perf_counter()
        try:
            logits = backend.forward(cache, torch.tensor(seq.tokens), last_only=True).logits  # (1, V)
            _, token = self._verify(Draft.empty(), logits, len(seq.tokens), sampling, generator, noise, coupled)
            metrics.prefill_time_s = time.perf_counter() - started
            new = self._append(seq, [token])
            metrics.new_tokens = len(new)
            yield new
            while not seq.finished:
                remaining = cfg.max_new_tokens - len(seq.generated)
                k = min(policy.choose(), remaining - 1) if self.drafter is not None else 0
                t0 = time.perf_counter()
                draft = self.drafter.propose(seq.tokens, k) if k > 0 else Draft.empty()
                t1 = time.perf_counter()
                ids = torch.tensor([seq.tokens[-1]] + draft.tokens.tolist())
                logits = backend.forward(cache, ids).logits  # (1 + len(draft), V)
                n, token = self._verify(draft, logits, len(seq.tokens), sampling, generator, noise, coupled)
                backend.truncate(cache, len(seq.tokens) + n)
                t2 = time.perf_counter()
                metrics.draft_time_s += t1 - t0
                metrics.verify_time_s += t2 - t1
                self.costs.observe_draft(len(draft), t1 - t0)
                self.costs.observe_verify(len(ids), t2 - t1)
                policy.observe(len(draft), n)
                new = self._append(seq, draft.tokens[:n].tolist() + [token])
                metrics.record_step(drafted=len(draft), accepted=n, emitted=len(new))
                metrics.new_tokens += len(new)
                yield new
        finally:
            metrics.total_time_s = time.perf_counter() - started
            metrics.finish_reason = seq.finished or "cancelled"
            if self.drafter is not None:
                self.drafter.end()
            backend.release(cache)

    def _verify(self, draft: Draft, logits: torch.Tensor, position: int, sampling, generator, noise, coupled):
        """(n accepted, next token) for target logits (k+1, V) over a draft of k tokens."""
        tokens = draft.tokens.to(logits.device)
        if sampling.greedy:
            return greedy_verify(tokens, logits)
        p = probs_from_logits(logits, sampling)
        if coupled:
            return coupled_verify(tokens, p, noise(list(range(position, position + len(draft) + 1))))
        probs = None if draft.probs is None else draft.probs.to(p.device)
        return rejection_verify(tokens, probs, p, generator)

    def _append(self, seq: _Sequence, new: list[int]) -> list[int]:
        """Appends tokens up to the first EOS or the length limit; marks the sequence finished."""
        cfg = seq.config
        eos = () if cfg.ignore_eos else self.target.info.eos_token_ids
        kept = []
        for token in new:
            kept.append(token)
            if token in eos:
                seq.finished = "stop"
                break
            if len(seq.generated) + len(kept) >= cfg.max_new_tokens:
                seq.finished = "length"
                break
        seq.tokens.extend(kept)
        return kept


class TextStream:
    """Iterates over text deltas of one generation; stop strings end it early and are cut off."""

    def __init__(self, decoder: SpecDecoder, prompt_ids: list[int], config: GenerationConfig):
        self.decoder = decoder
        self.seq = _Sequence(tokens=list(prompt_ids), prompt_len=len(prompt_ids), config=config)
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        seq = self.seq
        detok = IncrementalDetokenizer(self.decoder.target.tokenizer)
        stops = StopStrings(seq.config.stop)
        text, released, n_ids = "", 0, 0
        steps = self.decoder.decode(seq)
        try:
            for new in steps:
                for token in new:
                    n_ids += 1
                    before = len(text)
                    text += detok.add(token)
                    if seq.config.stop and (cut := stops.find(text, before)) >= 0:
                        text = text[:cut]
                        seq.finished = "stop"
                        break
                if seq.finished == "stop" and n_ids < len(seq.generated):
                    del seq.tokens[seq.prompt_len + n_ids:]  # tokens after the stop string's end
                safe = len(text) if seq.finished else stops.safe_length(text)
                if safe > released:
                    yield text[released:safe]
                    released = safe
                if seq.finished:
                    break
        finally:
            steps.close()
        if released < len(text):
            yield text[released:]
        self.result = GenerationResult(text=text, token_ids=seq.generated, prompt_ids=seq.tokens[: seq.prompt_len],
                                       metrics=seq.metrics, finish_reason=seq.finished or "length")
