"""Prompt lookup, and where the context has no earlier match, the target's own recent choices after the same tokens.

A verify pass scores every row it is given, and the target's choice at each row is what it would write after that
row's token: for the rows it keeps, the next token of the output, and for a rejected draft's rows, a choice that is
thrown away. Token Recycling (Luo et al., 2024) keeps those choices as a table from a token to what the target chose
after it last, and drafts by walking the table from the context's last token. Here the table is keyed by the last
token and by the last two (the pair wins where it is known), it learns from every row a verify pass scores and from
every token the requests emit, and it is shared by every request this drafter and its forks serve. Prompt lookup
(ngram.py) still drafts first: where the context repeats itself, copying it is right far more often than a table of
single choices.

The two sources are accepted at very different rates (a copied chain often runs for several tokens, a chain from
the table rarely past its first), so each keeps its own acceptance estimates and the drafter sizes its own chains:
a step where the context has a match drafts the copy as far as copies pay, a step without one drafts from the table
as far as the table's chains pay, or nothing. Both are scored on every step, drafted or not, from the tokens the
target goes on to emit (as select.py scores context-only candidates in the shadow), so a source that stopped paying
is measured again without a step spent on it. Deterministic (q one-hot); drafting costs microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...costs import CostModel
from ...policy import DraftLengthPolicy
from ..base import Budget, Draft, Drafter, DraftRequest
from ..options import NgramOptions
from ..trees import draft_accepted
from .ngram import ngram_lookup

MAX_PAIRS = 1 << 18  # pairs of tokens the table holds before it forgets them all (about 100 bytes each)
SOURCES = ("lookup", "table")  # where a step's chain comes from: a copy of the context, or the SuccessorTable
POLICY_LENGTH = 16  # positions each source's acceptance estimates cover


class SuccessorTable:
    """The target's latest choice after each token, and after each pair of tokens, it has read."""

    def __init__(self, max_pairs: int = MAX_PAIRS):
        self.after_token: dict[int, int] = {}
        self.after_pair: dict[int, int] = {}
        self.max_pairs = max_pairs

    def record(self, previous: int | None, token: int, choice: int) -> None:
        """The target chose `choice` after reading `token`, which followed `previous` (None: unknown)."""
        self.after_token[token] = choice
        if previous is not None:
            if len(self.after_pair) >= self.max_pairs:
                self.after_pair.clear()  # forgetting costs some drafts, never correctness
            self.after_pair[_pair(previous, token)] = choice

    def next_after(self, previous: int | None, token: int) -> int | None:
        """What the target chose last after this pair, else after this token, or None."""
        if previous is not None:
            choice = self.after_pair.get(_pair(previous, token))
            if choice is not None:
                return choice
        return self.after_token.get(token)

    def chain(self, previous: int | None, token: int, k: int) -> list[int]:
        """Up to k tokens walked from the context's last two (previous, token), each the table's choice after the
        one before it."""
        out: list[int] = []
        while len(out) < k:
            choice = self.next_after(previous, token)
            if choice is None:
                break
            out.append(choice)
            previous, token = token, choice
        return out


def _pair(previous: int, token: int) -> int:
    return previous << 32 | token


@dataclass
class Pending:
    """A chain drafted (or drafted in the shadow) at context length `start`, waiting for the tokens that score it."""

    source: str
    start: int
    tokens: list[int]


class RecycleDrafter(Drafter):
    """Prompt lookup where the context has a match, else a chain from the SuccessorTable of the target's choices;
    each source's chains sized by its own acceptance."""

    name = "recycle"
    needs_scores = True  # the choices at rejected drafts' rows feed the table too
    sizing = "drafter"  # alone, it sizes each source's chains by that source's acceptance (batches: the engine's k)

    def __init__(self, min_n: int = 2, max_n: int = 4, table: SuccessorTable | None = None):
        NgramOptions(min_n, max_n)  # refuses sizes out of range
        self.min_n, self.max_n = min_n, max_n
        self.table = table if table is not None else SuccessorTable()
        self._learned = 0  # the context's tokens up to here are in the table
        self._proposed: tuple[Draft, int] | None = None  # the last draft, and the token before it
        self.pending: list[Pending] = []
        self.policies: dict[str, DraftLengthPolicy] = {}

    def fork(self) -> "RecycleDrafter":
        return RecycleDrafter(self.min_n, self.max_n, self.table)

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self._learned = len(request.prompt_ids)  # the prompt's tokens are the user's, not the target's choices
        self._proposed = None
        self.pending = []
        costs = request.costs or CostModel()
        self.policies = {
            source: DraftLengthPolicy(POLICY_LENGTH, costs.for_drafter(f"recycle:{source}")) for source in SOURCES
        }

    def propose(self, context: list[int], budget: Budget) -> Draft:
        self._learn_context(context)
        self._score(context)
        chains = {
            "lookup": ngram_lookup(np.asarray(context, dtype=np.int64), budget.k, self.min_n, self.max_n).tolist()
        }
        previous = context[-2] if len(context) > 1 else None
        chains["table"] = self.table.chain(previous, context[-1], budget.k)
        for source, chain in chains.items():
            if chain and not any(p.source == source for p in self.pending):
                self.pending.append(Pending(source, len(context), chain))
        source = "lookup" if chains["lookup"] else "table"
        tokens = chains[source][: self._length(source, budget)]
        draft = Draft(tokens=torch.tensor(tokens, dtype=torch.long)) if tokens else Draft.empty()
        self._proposed = (draft, context[-1])
        return draft

    def _length(self, source: str, budget: Budget) -> int:
        """The drafts a step of this source holds: the most its acceptance and the measured costs favour (0: a plain
        step) where the request is verified alone and drafting adapts, else budget.k."""
        if not budget.tree or self.request is None or not self.request.adaptive:
            return budget.k
        return min(budget.k, self.policies[source].best_k())

    def _score(self, context: list[int]) -> None:
        """Scores the pending chains the context now tells about into their source's estimates."""
        still = []
        for p in self.pending:
            accepted = draft_accepted(p.tokens, None, context[p.start :])
            if accepted is None:
                still.append(p)  # the target has not yet written past the chain's agreement
            else:
                self.policies[p.source].observe(len(p.tokens), accepted)
        self.pending = still

    def scored(self, draft: Draft, choices: torch.Tensor, path: list[int]) -> None:
        """Records the target's choice at every drafted row, rejected ones included; the kept rows are learned
        again from the context (the same choices)."""
        if not len(draft) or self._proposed is None:
            return
        proposed, last = self._proposed
        self._proposed = None
        drafted = draft.tokens.tolist()
        if draft.parents is not None or drafted != proposed.tokens[: len(drafted)].tolist():
            return  # tokens a constraint forced, not this drafter's chain: their rows' inputs are not known here
        picked = choices.tolist()  # row 0 reads the context's last token; row i + 1 reads drafted[i]
        for token, choice in zip(drafted, picked[1:]):
            self.table.record(last, token, choice)
            last = token

    def learn(self, output: list[int]) -> None:
        if self.request is not None:
            self._learn_context(list(self.request.prompt_ids) + list(output))

    def _learn_context(self, context: list[int]) -> None:
        """Each token of the context past the prompt is the target's choice after the two before it."""
        for j in range(max(self._learned, 1), len(context)):
            self.table.record(context[j - 2] if j > 1 else None, context[j - 1], context[j])
        self._learned = max(self._learned, len(context))
