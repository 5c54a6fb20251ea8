"""The lookahead branch of lookahead decoding (Fu et al. 2024): W parallel Jacobi iterations whose history of
N - 1 steps yields n-grams, scored as extra nodes of the step's draft tree.

The window is N - 1 levels of W columns. Cell (l, c) guesses the token c + l places after the root (the step's
last emitted token): level l is what the iteration l steps ago held there, level N - 2 the newest. Cell (0, 0) is
the root itself. Each cell is a tree node whose path from the root is (0, 1) .. (0, c), then (1, c) .. (l, c):
the oldest level up to its column, then its column upwards (the attention mask of the paper's Figure 3, and of
llama.cpp's `lookahead`). Its depth, c + l, is its position. The target's choice at a top-level cell (N - 2, c)
guesses the token one place further; those W choices become the next top level, every level moves down one
(the root has moved on by at least one token: the window always shifts by one, as the authors' code does), and
each column read top to bottom, plus its new token, is an n-gram for the pool: (0, c), (1, c) .. (N - 2, c),
choice. A column's n-gram is kept once every token in it came from the target (N - 1 iterations after the
window was filled with prompt tokens; N - 2 for column 0, whose first token is the root).
"""

from __future__ import annotations


class JacobiWindow:
    """The lookahead window of one request: `levels[l][c]` for l < N - 1, c < W (levels[0][0] is unused: the root
    takes its place)."""

    def __init__(self, width: int, ngram: int, start: list[int]):
        """start: W * (N - 1) tokens to begin from (the authors copy random prompt tokens), level by level."""
        if len(start) != width * (ngram - 1):
            raise ValueError(f"a {width}x{ngram - 1} window starts from {width * (ngram - 1)} tokens, got {len(start)}")
        self.width, self.ngram = width, ngram
        self.levels = [list(start[l * width : (l + 1) * width]) for l in range(ngram - 1)]
        self.iterations = 0  # Jacobi steps taken: the top min(iterations, N - 1) levels hold the target's choices

    def cells(self) -> list[tuple[int, int]]:
        """The window's tree nodes, parents first: level 0 columns 1..W-1, then each higher level's W columns."""
        return [(0, c) for c in range(1, self.width)] + [
            (l, c) for l in range(1, self.ngram - 1) for c in range(self.width)
        ]

    def tree(self) -> tuple[list[int], list[int]]:
        """(tokens, parents) of the cells() as draft nodes under the root (parents index these nodes, -1: the root).

        Example: W 3, N 3, levels [[_, a, b], [c, d, e]] -> tokens [a, b, c, d, e], parents [-1, 0, -1, 0, 1]:
        a b is level 0's chain; c sits on the root (column 0), d on a, e on b.
        """
        index = {cell: i for i, cell in enumerate(self.cells())}
        tokens, parents = [], []
        for l, c in self.cells():
            tokens.append(self.levels[l][c])
            below = (l, c - 1) if l == 0 else (l - 1, c)  # level 0 continues its own chain; higher levels their column
            parents.append(index.get(below, -1))  # (0, 0) is the root
        return tokens, parents

    def top_nodes(self) -> list[int]:
        """For each column, the node (an index into tree()'s nodes; -1: the root) of its top-level cell, whose
        target choice is the column's next guess."""
        top = self.ngram - 2
        index = {cell: i for i, cell in enumerate(self.cells())}
        return [index.get((top, c), -1) for c in range(self.width)]

    def advance(self, root: int, choices: list[int]) -> list[list[int]]:
        """One Jacobi step: `choices` (W,) are the target's choices at the top-level cells (top_nodes()), the root
        the token the step was drafted after. Shifts the window and returns the n-grams (N tokens each) it yields.

        Example: W 2, N 3, after two steps, levels [[_, a], [c, d]], root r, choices [x, y] -> returns
        [[r, c, x], [a, d, y]], and the levels become [[c, d], [x, y]].
        """
        n, top = self.ngram, self.ngram - 2
        if len(choices) != self.width:
            raise ValueError(f"{self.width} choices expected, got {len(choices)}")
        grams = []
        for c in range(self.width):
            if self.iterations >= n - 1 - (c == 0):  # every token of the column came from the target
                first = root if c == 0 else self.levels[0][c]
                grams.append([first] + [self.levels[l][c] for l in range(1, top + 1)] + [choices[c]])
        self.levels = self.levels[1:] + [list(choices)]
        self.iterations += 1
        return grams
