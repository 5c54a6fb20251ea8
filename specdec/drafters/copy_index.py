"""Copy candidates for every node of a draft tree: what followed the latest earlier occurrence of its last tokens.

A one-layer head rarely learns to copy. On Spec-Bench answers of SmolLM2-135M, where the last four tokens of the
context occurred before (30% of positions), the token that followed them then is the target's next choice 84% of
the time, and the head's top choice only 45% (bench/copy_agreement.py). So a tree gets, under each node, the token
its path would copy next, scored by how often copies of that match length have been accepted.

CopyIndex keeps, for n = MIN_MATCH..MAX_MATCH, the token that followed the latest occurrence of each n-gram of the
accepted context, updated as the context grows: a lookup is a few dictionary reads, cheap enough for every node of
every level.
"""
from __future__ import annotations

import math

import torch

MIN_MATCH, MAX_MATCH = 2, 4


class CopyIndex:
    """n-gram -> the token that followed its latest occurrence in the accepted context."""

    def __init__(self):
        self.tokens: list[int] = []
        self.follows: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(MIN_MATCH, MAX_MATCH + 1)}

    def sync(self, context: list[int]) -> None:
        """Indexes the tokens of context not seen yet (a context that is not an extension is indexed afresh)."""
        seen = len(self.tokens)
        if len(context) < seen or context[:seen] != self.tokens:
            self.__init__()
            seen = 0
        self.tokens.extend(context[seen:])
        tokens = self.tokens
        for end in range(max(seen, MIN_MATCH), len(tokens)):  # the n-gram tokens[end-n:end], followed by tokens[end]
            for n, table in self.follows.items():
                if end >= n:
                    table[tuple(tokens[end - n:end])] = tokens[end]

    def next_token(self, path: list[int]) -> tuple[int, int] | None:
        """(token, match length) that the accepted context followed by `path` would copy next: the longest suffix
        found (MAX_MATCH down to MIN_MATCH tokens, the latest occurrence), or None."""
        tail = (self.tokens[-MAX_MATCH:] + path)[-MAX_MATCH:] if len(path) < MAX_MATCH else path[-MAX_MATCH:]
        for n in range(min(MAX_MATCH, len(tail)), MIN_MATCH - 1, -1):
            token = self.follows[n].get(tuple(tail[-n:]))
            if token is not None:
                return token, n
        return None


class CopyRecord:
    """How often a copy candidate with each match length was accepted where its parent was: (accepted + prior *
    weight) / (trials + weight). The priors are what the training data's held-out answers show."""

    PRIOR = {2: 0.6, 3: 0.7, 4: 0.8}

    def __init__(self, weight: float = 8.0):
        self.weight = weight
        self.accepted = {n: 0 for n in self.PRIOR}
        self.trials = {n: 0 for n in self.PRIOR}

    def probability(self, n: int) -> float:
        return (self.accepted[n] + self.PRIOR[n] * self.weight) / (self.trials[n] + self.weight)

    def observe(self, n: int, accepted: bool) -> None:
        self.trials[n] += 1
        self.accepted[n] += int(accepted)


def with_copies(cand: torch.Tensor, step: torch.Tensor, found: list[tuple[int, int] | None], record: CopyRecord):
    """The head's candidates cand (F, W) token ids with their log-probs of acceptance step (F, W), and each row's
    copy `found` (token, match length) mixed in: the copied token gets p + (1 - p) q and the head's others
    (1 - p) q, where p is record's acceptance for copies of its match length and q the head's. A copy the head did
    not rank takes an extra column (-inf in the other rows). Returns (tokens, log-probs, found)."""
    if not any(found):
        return cand, step, found
    # a few rows of a few columns: Python lists cost less than torch's per-element operations
    cand_rows, step_rows = cand.tolist(), step.tolist()
    for r, hit in enumerate(found):
        row_tokens, row_steps = cand_rows[r], step_rows[r]
        row_tokens.append(-1)
        row_steps.append(-math.inf)
        if hit is None:
            continue
        token, n = hit
        p = record.probability(n)
        j = row_tokens.index(token) if token in row_tokens else len(row_tokens) - 1
        q = math.exp(row_steps[j])
        rest = math.log1p(-p)
        step_rows[r] = [s + rest for s in row_steps]
        step_rows[r][j] = math.log(p + (1 - p) * q)
        row_tokens[j] = token
    return torch.tensor(cand_rows), torch.tensor(step_rows), found


def copy_chain(index: CopyIndex, record: CopyRecord, path: list[int], length: int) -> list[tuple[int, int, float]]:
    """Up to `length` tokens the accepted context followed by `path` goes on to copy: [(token, match length, log of
    its chance of acceptance)]."""
    path, chain = list(path), []
    while len(chain) < length and (hit := index.next_token(path)) is not None:
        token, n = hit
        chain.append((token, n, math.log(record.probability(n))))
        path.append(token)
    return chain
