"""Lookahead decoding (Fu et al. 2024): n-grams from parallel Jacobi iterations, verified in the same target pass.

Each lookahead step drafts one tree made of two branches, scored in the one forward the step makes anyway:
  verification branch - up to G n-grams from the pool that continue the root (the last emitted token), merged
                        into a trie: the only nodes meant to be accepted;
  lookahead branch    - the W x (N - 1) Jacobi window (jacobi.py), whose nodes' own rows are read back after the
                        pass (Drafter.scored: the target's choice at every scored row, rejected ones included);
                        each step yields up to W new n-grams for the pool.
The window's nodes are ordinary tree nodes to the engine, so verification is specdec's own (greedy, rejection or
coupled tree rules) and the output is exactly the target's; a window node is accepted only where it happens to be
right. The price of sharing the pass: a step scores up to (N - 1)(G + W) tokens (20 for the defaults W 4, N 3,
G 6), and metrics count every node as drafted, so the acceptance rate shows that cost; MAT and tokens per second
show whether it pays. (The alternative, a separate pass for the window, would cost a second forward per step.)

The pool is the suffix drafter's counting index (SuffixIndex) over the harvested n-grams, one per request; guesses
are its most frequent continuations of the root. No model is trained and nothing but the target runs.

Whether it pays: a flat verify curve (a GPU) makes the wide pass nearly free; on a CPU a pass of 20 tokens costs
several single-token passes, so it pays only where the pool's guesses are accepted far (repetitive text). Alone,
the drafter decides each step itself from the measured costs: the window runs for its warm-up (N - 1 steps before
its first n-grams, then N + 3 more, while the pool fills) and then while its measured tokens per second (accepted
+ 1 over the verify curve at the tree's size plus the drafter's own time, decayed) stay within 5% of plain
decoding's (its steps also fill the pool); otherwise it pauses for 8 steps, doubling up to 256 while it keeps
losing, with 3 probe steps after each pause (plus a warm-up for a cold window). The pause outlives the request:
forks share it, so later requests do not each pay a warm-up to learn the window loses. Meanwhile the pool's best guess is drafted alone as a chain, as far
as its measured acceptance pays (a DraftLengthPolicy scored on every step, drafted or not), or nothing. In a batch
(chains only) the pool's best guess is drafted, the engine sizing it; the window does not move there, so the pool
grows only while the request runs alone.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import torch

from ...costs import CostModel
from ...policy import DraftLengthPolicy
from ...tokens import common_prefix
from ..base import Budget, Draft, Drafter, DraftRequest
from .jacobi import JacobiWindow
from ..options import LookaheadOptions
from .suffix import SuffixIndex

POOL_TOKENS = 1 << 16  # n-gram tokens a request's pool keeps, the oldest forgotten first
DECAY = 0.9  # weight of older lookahead steps in the measured rate
JUDGE_AFTER = 3  # window steps, after 2 N, before its rate is trusted (the pool takes a while to hold the roots)
FIRST_PAUSE, MAX_PAUSE, PROBE_STEPS = 8, 256, 3
SLACK = 0.05  # the window runs while within 5% of plain decoding's speed: its steps also fill the pool


def pool_guesses(pool: SuffixIndex, root: int, depth: int, count: int) -> list[list[int]]:
    """Up to `count` continuations of `root` in the pool, most probable first (the product of each step's share of
    the counts), each `depth` tokens long or shorter where the pool knows no further.

    Example: pool of n-grams [5 1 2], [5 1 2], [5 1 3], root 5, depth 2, count 2 -> [[1, 2], [1, 3]].
    """
    found: list[list[int]] = []
    frontier: list[tuple[float, int, list[int]]] = [(-1.0, 0, [])]  # (-probability, tie-break, path): a heap
    pushed = 0
    while frontier and len(found) < count:
        negative, _, path = heapq.heappop(frontier)
        nexts = pool.continuations([root] + path) if len(path) < depth else {}
        if not nexts:
            if path:
                found.append(path)
            continue
        total = sum(nexts.values())
        for token, n in sorted(nexts.items(), key=lambda item: -item[1])[:count]:
            pushed += 1
            heapq.heappush(frontier, (negative * n / total, pushed, path + [token]))
    return found


def trie(paths: list[list[int]]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the paths merged where they share a prefix (siblings distinct, parents first).

    Example: [[1, 2], [1, 3], [4]] -> tokens [1, 2, 3, 4], parents [-1, 0, 0, -1].
    """
    tokens, parents, child = [], [], {}
    for path in paths:
        node = -1
        for token in path:
            if (node, token) not in child:
                tokens.append(token)
                parents.append(node)
                child[(node, token)] = len(tokens) - 1
            node = child[(node, token)]
    return tokens, parents


@dataclass
class LookaheadStats:
    """What one request's lookahead did (kept after it ends, until the next begins)."""

    lookahead_steps: int = 0  # steps that scored the window
    chain_steps: int = 0  # steps that drafted the pool's best guess alone
    harvested: int = 0  # n-grams the window gave the pool
    guess_accepted: int = 0  # accepted tokens drafted by the verification branch
    window_accepted: int = 0  # accepted tokens that were window nodes


@dataclass
class PauseState:
    """The window's pause, shared by a drafter and its forks and carried from request to request: a window that
    lost in one request stays paused in the next ones for the rest of its pause (a new request's window, cold,
    would otherwise pay its warm-up again each time)."""

    left: int = 0  # steps still paused
    length: int = FIRST_PAUSE  # the next pause's length: doubles while the window keeps losing


@dataclass
class _Step:
    """A lookahead step's draft, waiting for the target's choices."""

    root: int
    tokens: list[int]
    parents: list[int]
    guesses: int  # the first `guesses` nodes are the pool's trie; the window's follow
    draft_s: float


class LookaheadDrafter(Drafter):
    """Lookahead decoding: window W, n-gram size N, guess set G (Fu et al. 2024)."""

    name = "lookahead"
    needs_scores = True
    #: alone (where a step allows a tree) it sizes its own tree, the window's and the trie's nodes, and decides
    #: itself whether a step runs the window, drafts a chain, or drafts nothing (the engine's policy would judge
    #: its wide trees as chains of the same length)
    sizing = "drafter"

    def __init__(
        self,
        window: int | None = None,
        ngram: int | None = None,
        guesses: int | None = None,
        pause: PauseState | None = None,
    ):
        """window, ngram, guesses: W, N and G (None: the defaults, options.LOOKAHEAD_DEFAULTS), refused naming the
        option where out of range; pause: the pause shared with the drafter this one was forked from."""
        self.window_size, self.ngram, self.guesses = LookaheadOptions(window, ngram, guesses).sizes()
        self.pause = pause if pause is not None else PauseState()
        self.request: DraftRequest | None = None
        self.stats = LookaheadStats()
        self._reset()

    def fork(self) -> "LookaheadDrafter":
        return LookaheadDrafter(self.window_size, self.ngram, self.guesses, self.pause)

    def _reset(self) -> None:
        self.pool = SuffixIndex(max_n=self.ngram - 1, max_tokens=POOL_TOKENS)
        self.window: JacobiWindow | None = None  # filled at the first lookahead step
        self.step: _Step | None = None
        self.shadow: tuple[int, list[int]] | None = None  # (context length, the pool's best guess there)
        self.tokens, self.seconds = 0.0, 0.0  # decayed yield of the window's steps once it yields n-grams
        self.probing = 0  # steps the window runs after a pause, whatever its rate

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self._reset()
        self.stats = LookaheadStats()
        self.costs = request.costs or CostModel()
        self.chains = DraftLengthPolicy(self.ngram - 1, self.costs)  # acceptance of the best guess, per position

    def end(self) -> None:
        self._reset()

    # ---- a step ----------------------------------------------------------------------------------
    def propose(self, context: list[int], budget: Budget) -> Draft:
        """Alone (budget.tree): the window and the pool's trie, or while the window is paused the pool's best guess
        as a chain; in a batch: the pool's best guess, up to budget.k tokens."""
        k = budget.k
        self.step = None  # a step never scored (a plain one, or a draft cut to fit the context) teaches nothing
        if k <= 0:
            return Draft.empty()
        start = time.perf_counter()
        self._score_shadow(context)
        paths = pool_guesses(self.pool, context[-1], min(k, self.ngram - 1), self.guesses)
        self.shadow = (len(context), paths[0]) if paths else None
        if budget.tree and (not self.current.adaptive or self._lookahead_pays()):
            return self._lookahead(context, paths, start)
        chain = paths[0] if paths else []
        if chain and budget.tree:  # the window paused: the guess as far as its measured acceptance pays
            chain = chain[: self.chains.best_k(self.chains.acceptance()[: len(chain)])]
        self.stats.chain_steps += bool(chain)
        return Draft(tokens=torch.tensor(chain, dtype=torch.long))

    def _lookahead(self, context: list[int], paths: list[list[int]], start: float) -> Draft:
        """The verification branch's trie, then the window's nodes."""
        if self.window is None:
            self.window = JacobiWindow(self.window_size, self.ngram, self._start_tokens())
        tokens, parents = trie(paths)
        guesses = len(tokens)
        window_tokens, window_parents = self.window.tree()
        tokens += window_tokens
        parents += [p + guesses if p >= 0 else -1 for p in window_parents]
        self.step = _Step(context[-1], tokens, parents, guesses, time.perf_counter() - start)
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long), parents=list(parents))

    def _start_tokens(self) -> list[int]:
        """W (N - 1) prompt tokens drawn at random (the authors' start): Jacobi iterations converge from anything,
        and the prompt's tokens are likelier than arbitrary ones."""
        prompt = self.current.prompt_ids
        generator = self.current.generator or torch.Generator().manual_seed(0)
        picks = torch.randint(len(prompt), (self.window_size * (self.ngram - 1),), generator=generator)
        return [prompt[i] for i in picks.tolist()]

    def scored(self, draft: Draft, choices: torch.Tensor, path: list[int]) -> None:
        """Moves the window one Jacobi step with the target's choices at its top level; pools the n-grams."""
        step, self.step, window = self.step, None, self.window
        if step is None or window is None or draft.parents != step.parents or draft.tokens.tolist() != step.tokens:
            return  # not a lookahead step of this drafter's (a chain, or forced tokens of a constraint)
        start = time.perf_counter()
        rows = choices.tolist()
        top = [rows[0] if node < 0 else rows[1 + step.guesses + node] for node in window.top_nodes()]
        grams = window.advance(step.root, top)
        for gram in grams:
            self.pool.store(gram)
        stats = self.stats
        stats.lookahead_steps += 1
        stats.harvested += len(grams)
        stats.guess_accepted += sum(node < step.guesses for node in path)
        stats.window_accepted += sum(node >= step.guesses for node in path)
        if window.iterations >= self.ngram:  # its rate counts from its first n-grams on (the warm-up pays for later)
            seconds = self.costs.verify_s(1 + len(step.tokens)) + step.draft_s + time.perf_counter() - start
            self.tokens = DECAY * self.tokens + len(path) + 1
            self.seconds = DECAY * self.seconds + seconds

    # ---- whether the window pays -----------------------------------------------------------------------
    def _lookahead_pays(self) -> bool:
        """Whether this step runs the window: during its warm-up, while its measured tokens per second stay within
        SLACK of plain decoding's, and through the probe after each pause (a pause doubles while it keeps losing)."""
        pause = self.pause
        if not pause.left and not self.probing and not self._wins():
            pause.left, pause.length = pause.length, min(2 * pause.length, MAX_PAUSE)
        if pause.left:
            pause.left -= 1
            if not pause.left:  # half the evidence forgotten: the probe's steps weigh as much as the old ones
                self.tokens, self.seconds = self.tokens / 2, self.seconds / 2
                self.probing = PROBE_STEPS + self._warm_up_left()
            return False
        self.probing = max(0, self.probing - 1)
        return True

    def _wins(self) -> bool:
        if self._warm_up_left():
            return True
        if self.tokens / self.seconds >= (1.0 - SLACK) / self.costs.verify_s(1):
            self.pause.length = FIRST_PAUSE
            return True
        return False

    def _warm_up_left(self) -> int:
        """Window steps before its rate is judged: N - 1 before its first n-grams, then N + JUDGE_AFTER + 1 more."""
        return max(0, 2 * self.ngram + JUDGE_AFTER - (self.window.iterations if self.window is not None else 0))

    def _score_shadow(self, context: list[int]) -> None:
        """How far the pool's best guess of the last step was followed by the target (drafted or not: a token is
        accepted if and only if the target emits it there), into the chain's acceptance estimates."""
        if self.shadow is None:
            return
        at, chain = self.shadow
        self.shadow = None
        after = context[at:]
        matched = common_prefix(chain, after)
        if matched < len(after) or matched == len(chain):  # else the text stops before telling
            self.chains.observe(len(chain), matched)
