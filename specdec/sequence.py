"""One request while it decodes, and its half of each step: propose, then accept or roll back.

The engines (engine.SpecDecoder for one sequence, batch.BatchEngine for many) own the target pass;
a SequenceState owns everything per request: tokens, KV cache, drafter, draft-length policy,
random streams and metrics.
"""
from __future__ import annotations

import time

import torch

from .adaptive import CostModel, DraftLengthPolicy
from .config import GenerationConfig, SpeculationConfig
from .drafters.base import Draft, Drafter, DraftRequest
from .errors import ConfigError, ContextLengthError
from .logprobs import TokenLogprob, prompt_logprobs, token_logprobs
from .metrics import GenerationMetrics
from .penalties import TokenHistory, chain_ancestors, penalize, tree_ancestors
from .sampling import make_generator, position_gumbel, probs_from_logits, warp_logits
from .structured import ConstraintState, apply_masks
from .verify import (coupled_verify, greedy_verify, rejection_verify, tree_coupled_verify, tree_depths,
                     tree_greedy_verify, tree_mask, tree_rejection_verify)


class SequenceState:
    """Invariant between steps: the target's cache holds every token but the last one."""

    def __init__(self, prompt_ids: list[int], config: GenerationConfig, backend, drafter: Drafter | None,
                 speculation: SpeculationConfig, costs: CostModel, allow_tree: bool = True, learn: bool = True,
                 tokenizer=None, tracer=None):
        """learn: hand the output to the drafter when the request ends (Drafter.learn); off for warm-up runs.
        tokenizer: the target's, for a structured-output constraint. tracer: a TraceWriter (specdec/trace.py)
        that records the request when it ends."""
        info = backend.info
        self.tokens = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.config = config
        self.backend = backend
        self.drafter = drafter
        self.metrics = GenerationMetrics(prompt_tokens=self.prompt_len)
        self.finished = ""
        self.k_max = speculation.num_speculative_tokens if drafter is not None else 0
        if self.prompt_len == 0:
            raise ConfigError("the prompt is empty")
        if self.prompt_len + config.max_new_tokens + self.k_max + 1 > info.max_context:
            room = f" and room for {self.k_max + 1} draft tokens" if self.k_max else ""
            raise ContextLengthError(f"prompt ({self.prompt_len} tokens) plus max_new_tokens ({config.max_new_tokens})"
                                     f"{room} exceeds the model's context of {info.max_context} tokens")
        sampling = config.sampling
        if sampling.logit_bias and max(t for t, _ in sampling.logit_bias) >= info.vocab_size:
            raise ConfigError(f"logit_bias names a token id outside the vocabulary [0, {info.vocab_size})")
        self.history = TokenHistory(prompt_ids, info.vocab_size, info.device) if sampling.penalized else None
        self.logprobs: list[TokenLogprob] | None = [] if config.logprobs is not None else None  # one per output token
        self.prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token, after the prefill if asked for
        self.constraint = None if config.constraint is None else ConstraintState(
            config.constraint, tokenizer, info.vocab_size, info.eos_token_ids)
        self.seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        self.generator = make_generator(self.seed)
        self.coupled = not sampling.greedy and speculation.sampling_verifier == "coupled"
        self.eos = () if config.ignore_eos else info.eos_token_ids
        self.costs = costs.for_drafter(drafter.name) if drafter is not None else costs  # its own drafting cost
        self.policy = DraftLengthPolicy(self.k_max, self.costs, adaptive=speculation.adaptive)
        self.needs_features = drafter is not None and drafter.needs_features
        keep_features = self.needs_features and getattr(backend, "prefix_cache", None) is not None
        self.features: list[torch.Tensor] | None = [] if keep_features else None  # hidden rows, for the cache
        self.cache = self._claim_prefix() or backend.new_cache()
        self.metrics.cached_prompt_tokens = self.cache.length
        self.started_at = time.perf_counter()
        self.learn = learn
        self.tracer = tracer
        self.step_log: list[list[int]] | None = [] if tracer is not None else None  # [drafted, accepted] per step
        if drafter is not None:
            drafter.begin(DraftRequest(prompt_ids=list(prompt_ids), sampling=sampling,
                                       generator=make_generator(self.seed + 1),
                                       noise=self.noise if self.coupled else None, costs=self.costs,
                                       allow_tree=allow_tree, adaptive=speculation.adaptive))

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    def noise(self, positions: list[int]) -> torch.Tensor:
        """Gumbel noise fixed by (seed, position), for coupled sampling: (len(positions), V)."""
        info = self.backend.info
        return position_gumbel(self.seed, positions, info.vocab_size, info.device)

    # ---- the step, in order ----------------------------------------------------------------------
    def prefill_ids(self) -> torch.Tensor:
        """The prompt tokens the prefill scores: those after the prefix restored from the prefix cache."""
        return torch.tensor(self.tokens[self.cache.length:])

    @property
    def prefill_all_logits(self) -> bool:
        """Whether the prefill must return every prompt row's logits (for prompt logprobs), not the last one's."""
        return self.config.prompt_logprobs is not None

    def start(self, logits: torch.Tensor, seconds: float, hidden: torch.Tensor | None = None) -> list[int]:
        """Takes the prefill's logits, (1, V) for the last prompt token or (prompt length, V) when
        prefill_all_logits; emits the first token.

        hidden: the prompt's hidden states (prompt length, H), for drafters that read features.
        """
        if self.prefill_all_logits:
            self.prompt_logprobs = prompt_logprobs(logits[:-1], self.tokens[: self.prompt_len],
                                                   self.config.prompt_logprobs)
        last_logits = logits[-1:]
        if self.needs_features:
            if self.features is not None:  # restored rows first, then the prefill's (prompt length, H) in all
                hidden = torch.cat([*self.features, hidden.to(self.features[0].device)]) if self.features else hidden
                self.features = [hidden]
            self.drafter.observe(hidden)
        processed = self.processed(last_logits, Draft.empty())
        _, token = self.verify(Draft.empty(), processed)
        self.metrics.prefill_time_s = seconds
        new = self.append([token])
        self._record_logprobs(self._logprob_logits(last_logits, processed), new)
        self.metrics.new_tokens = len(new)
        return new

    def draft_cap(self) -> int:
        """Most drafts worth proposing: a step emits at most k + 1 tokens."""
        return min(self.k_max, self.config.max_new_tokens - len(self.generated) - 1)

    def propose(self, k: int) -> Draft:
        if k <= 0 or self.drafter is None:
            return Draft.empty()
        if self.constraint is not None and (forced := self.constraint.forced(k)):
            return Draft(tokens=torch.tensor(forced, dtype=torch.long))  # the text the constraint forces next
        t0 = time.perf_counter()
        # the verify pass caches every draft for a moment: a tree larger than the context's room is cut to fit
        draft = self.drafter.propose(self.tokens, k).head(self.backend.info.max_context - len(self.tokens))
        seconds = time.perf_counter() - t0
        self.metrics.draft_time_s += seconds
        self.costs.observe_draft(draft.positions, seconds)
        return draft

    def step_ids(self, draft: Draft) -> torch.Tensor:
        """The tokens the target scores: the last emitted token, then the drafts: (1 + k,)."""
        return torch.tensor([self.tokens[-1]] + draft.tokens.tolist())

    @staticmethod
    def step_mask(draft: Draft) -> torch.Tensor | None:
        """The tree attention mask (1 + k, 1 + k) for a tree draft; None for a chain."""
        return tree_mask(draft.parents) if draft.parents is not None else None

    def finish_step(self, draft: Draft, logits: torch.Tensor, verify_seconds: float,
                    hidden: torch.Tensor | None = None) -> list[int]:
        """Verifies the target's logits (1 + k, V), rolls back rejected cache entries, emits the new tokens.

        A tree keeps only the accepted path in the cache (compaction). hidden (1 + k, H): the target's
        hidden states of the scored rows, passed on for the kept ones to drafters that read features.
        """
        processed = self.processed(logits, draft)  # before append moves the penalties' counts and the constraint
        if draft.parents is not None:
            path, token = self.verify_tree(draft, processed)
            rows = [0] + [i + 1 for i in path]
            self.backend.compact(self.cache, len(self.tokens) - 1, rows)
            accepted = draft.tokens[path].tolist()
        else:
            n, token = self.verify(draft, processed)
            self.backend.truncate(self.cache, len(self.tokens) + n)
            rows = list(range(n + 1))
            accepted = draft.tokens[:n].tolist()
        n = len(accepted)
        if self.needs_features:
            self.drafter.observe(hidden[rows])
            if self.features is not None:
                self.features.append(hidden[rows])
        self.metrics.verify_time_s += verify_seconds
        self.policy.observe(len(draft), n)
        if self.step_log is not None:
            self.step_log.append([len(draft), n])
        new = self.append(accepted + [token])
        self._record_logprobs(self._logprob_logits(logits, processed), new, rows)
        self.metrics.record_step(drafted=len(draft), accepted=n, emitted=len(new), source=draft.source)
        self.metrics.new_tokens += len(new)
        return new

    def take_text(self, text, new: list[int]) -> tuple[str, bool]:
        """(text delta of a step's new tokens through the request's TextAssembler, whether a stop string ended the
        request there): the one place stop strings end a request (the tokens after one are dropped)."""
        delta, kept = text.add(new)
        if kept is not None:
            self.stop_within_step(new, kept)
        return delta, kept is not None

    def stop_within_step(self, new: list[int], kept: int) -> None:
        """A stop string ended the text within this step's new tokens: keeps the first `kept` of them."""
        dropped = len(new) - kept
        if dropped:
            del self.tokens[-dropped:]
            if self.logprobs is not None:
                del self.logprobs[-dropped:]
        self.finished = "stop"

    def close(self, reason: str = "cancelled") -> None:
        """Frees the cache slot and the drafter; idempotent."""
        if self.cache is None:
            return
        self.metrics.total_time_s = time.perf_counter() - self.started_at
        self.metrics.finish_reason = self.finished or reason
        if self.drafter is not None:
            learn = getattr(self.drafter, "learn", None)  # drafters that do not subclass Drafter may lack it
            if self.learn and learn is not None:
                learn(self.generated)
            self.drafter.end()
        self._park_or_release()
        self.cache = None
        if self.tracer is not None and self.generated:
            self.tracer.write(self)

    # ---- prefix cache ---------------------------------------------------------------------------
    def _claim_prefix(self):
        """The cache of an earlier sequence that began as this prompt does, from the backend's prefix cache
        (for a drafter that reads features, one that kept its hidden states, which `start` hands on with the
        prefill's); None when there is none, or when the request asks for every prompt row's logprobs."""
        prefix = getattr(self.backend, "prefix_cache", None)
        if prefix is None or self.prefill_all_logits:
            return None
        claimed = prefix.claim(self.tokens, features=self.needs_features)
        if claimed is None:
            return None
        cache, features = claimed
        if features is not None:
            self.features = [features]  # the restored rows' hidden states, for the drafter at the prefill
        return cache

    def _park_or_release(self) -> None:
        """Hands the cache to the prefix cache (its rows that a later prefill would compute identically), or
        frees its slot."""
        prefix = getattr(self.backend, "prefix_cache", None)
        if prefix is not None:
            rows = min(len(self.tokens), self.backend.exact_prefix_rows(self.cache, self.prompt_len))
            # none where the sequence ended before its prefill, or where a drafter built meanwhile asked the target
            # for more feature layers (CausalLM.add_feature_layers): its rows have two widths
            same_width = self.features and len({f.shape[-1] for f in self.features}) == 1
            features = torch.cat(self.features) if same_width else None
            if features is not None and features.shape[0] < rows:
                features = None
            if prefix.park(self.tokens[:rows], self.cache, features):
                return
        self.backend.release(self.cache)

    # ---- helpers --------------------------------------------------------------------------------
    def verify(self, draft: Draft, logits: torch.Tensor) -> tuple[int, int]:
        """(n accepted, next token) for the target's processed logits (k + 1, V) over a draft of k tokens."""
        sampling = self.config.sampling
        tokens = draft.tokens.to(logits.device)
        if sampling.greedy:
            return greedy_verify(tokens, logits)
        p = probs_from_logits(logits, sampling)
        if self.coupled:
            position = len(self.tokens)
            return coupled_verify(tokens, p, self.noise(list(range(position, position + len(draft) + 1))))
        probs = None if draft.probs is None else draft.probs.to(p.device)
        return rejection_verify(tokens, probs, p, self.generator)

    def verify_tree(self, draft: Draft, logits: torch.Tensor) -> tuple[list[int], int]:
        """(accepted path of node indices, next token) for a tree draft; processed logits (1 + N, V)."""
        sampling = self.config.sampling
        if sampling.greedy:
            return tree_greedy_verify(draft.tokens, draft.parents, logits)
        p = probs_from_logits(logits, sampling)
        if self.coupled:
            position = len(self.tokens)
            rows = [position] + [position + d for d in tree_depths(draft.parents)]
            return tree_coupled_verify(draft.tokens, draft.parents, p, self.noise(rows))
        return tree_rejection_verify(draft.tokens, draft.parents, p, self.generator)

    def processed(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """The request's penalties applied to the scored rows (1 + k, V), each counting the drafts on its path, and
        its structured-output constraint (each row masked to what may follow its path); the logits themselves where
        the request asks for neither."""
        if self.history is not None:
            ancestors = tree_ancestors(draft.parents) if draft.parents is not None else chain_ancestors(len(draft))
            counts, seen = self.history.rows(draft.tokens, ancestors)
            logits = penalize(logits, counts, seen, self.config.sampling)
        if self.constraint is not None:
            logits = apply_masks(logits, self.constraint.row_masks(draft.tokens.tolist(), draft.parents))
        return logits

    def _logprob_logits(self, raw: torch.Tensor, processed: torch.Tensor) -> torch.Tensor | None:
        """The logits (R, V) whose log-softmax the request's logprobs are: the raw ones, or (logprobs_mode
        "processed") those tokens are drawn from (the processed ones, warped when sampling); None when the request
        asks for no logprobs."""
        if self.logprobs is None:
            return None
        if self.config.logprobs_mode == "raw":
            return raw
        sampling = self.config.sampling
        return processed.float() if sampling.greedy else warp_logits(processed.float(), sampling)

    def _record_logprobs(self, logits: torch.Tensor | None, new: list[int], rows: list[int] | None = None) -> None:
        """logits (R, V) from _logprob_logits; rows[j] (default j) holds the distribution new[j] was chosen from."""
        if self.logprobs is not None:
            scored = logits if rows is None else logits[rows[: len(new)]]
            self.logprobs += token_logprobs(scored, new, self.config.logprobs)

    def append(self, new: list[int]) -> list[int]:
        """Appends tokens up to the first EOS or the length limit; marks the sequence finished."""
        kept = []
        for token in new:
            kept.append(token)
            if token in self.eos or (self.constraint is not None and self.constraint.advance(token)):
                self.finished = "stop"  # the end of the sequence, or of the constrained text
                break
            if len(self.generated) + len(kept) >= self.config.max_new_tokens:
                self.finished = "length"
                break
        self.tokens.extend(kept)
        if self.history is not None:
            self.history.extend(kept)
        return kept
