"""EAGLE drafting as shape-static tensor code: a whole step's chain or tree with no host read until its end.

The host drafter (eagle.py) reads each drafted token back to choose the next pass, and grows the head's KV cache
with torch.cat. Here every shape depends only on the step's bucket (chain length k; tree depth D x width W;
nodes kept N; key window), and nothing reads a value back to the host, so on CUDA the whole step can be captured
as one graph and replayed (head_graphs.py); on the CPU the same code runs uncaptured:
  - the head's keys and values live in a preallocated buffer (HeadCache): rollback is setting its length, and
    drafted pairs are written past it with index_copy_ at rows computed on the device from a length tensor;
  - each head pass attends over a fixed window of the buffer plus its own new pairs, with a mask built on the
    device (true pairs: rows below the length; tree nodes: their ancestors' rows; each new pair: itself);
  - the true pairs accepted in a step are fed the same way, padded to a bucket of sizes (feed_pairs);
  - a chain takes the argmax of each level (greedy); a tree keeps, per level, the W most probable of the
    frontier's W x W continuations by cumulative draft log-probability (EAGLE-2), and at the end the N most
    probable nodes (a stable sort, so a parent, never less probable and earlier, precedes its children), put in
    node order so that parents[i] < i.
"""

from __future__ import annotations

import torch

NO_PARENT = -1


class HeadCache:
    """The head's keys and values of the true pairs, (1, nkv, capacity, hd) each, in a preallocated buffer.

    Rows below `length` hold the true pairs (f_t, x_{t+1}) in position order; rows past it are scratch that
    drafting writes and the next true pairs overwrite. Growing reallocates (graphs that read the old buffer must
    be captured again: `keys.data_ptr()` changes)."""

    def __init__(self, config, device: torch.device, dtype: torch.dtype, capacity: int = 512):
        self.shape = (1, config.num_kv_heads, capacity, config.head_dim)
        self.keys = torch.zeros(self.shape, device=device, dtype=dtype)  # zeros: masked rows never carry NaN
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, rows: int, keep: int | None = None) -> None:
        """Makes room for `rows` rows in all (the true pairs and what a step drafts past them), doubling; a new
        buffer keeps the first `keep` rows (default: the true pairs')."""
        if rows <= self.capacity:
            return
        capacity, keep = self.capacity, self.length if keep is None else keep
        while capacity < rows:
            capacity *= 2
        keys, values = self.keys, self.values
        self.keys = keys.new_zeros(*keys.shape[:2], capacity, keys.shape[3])
        self.values = torch.zeros_like(self.keys)
        self.keys[:, :, :keep] = keys[:, :, :keep]
        self.values[:, :, :keep] = values[:, :, :keep]

    def past(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The true pairs' (keys, values) (1, nkv, length, hd), views of the buffer, or None when there are none."""
        return self.window(self.length)

    def window(self, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The first `rows` rows' (keys, values) (1, nkv, rows, hd), views of the buffer (the true pairs, then
        what a step drafted past them), or None for none."""
        if not rows:
            return None
        return self.keys[:, :, :rows], self.values[:, :, :rows]

    def write(self, row: int, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Writes the keys and values (1, nkv, T, hd) of T pairs at rows [row, row + T), keeping the rows before
        them: drafted pairs past the true ones, which the next true pairs overwrite."""
        n = kv[0].shape[2]
        self.reserve(row + n, keep=row)
        self.keys[:, :, row : row + n] = kv[0]
        self.values[:, :, row : row + n] = kv[1]

    def append(self, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Appends the keys and values (1, nkv, T, hd) of T true pairs after the first `length` rows."""
        self.write(self.length, kv)
        self.length += kv[0].shape[2]


class FeatureRows:
    """The target's features the head has been given, (rows, H), in a buffer that doubles when full, so that a step's
    few new rows are copied and not the whole history."""

    def __init__(self, width: int, device: torch.device, dtype: torch.dtype, capacity: int = 256):
        self.buffer = torch.empty(capacity, width, device=device, dtype=dtype)
        self.rows = 0

    def view(self) -> torch.Tensor:
        """The rows given so far (rows, H), a view of the buffer."""
        return self.buffer[: self.rows]

    def append(self, rows: torch.Tensor) -> None:
        """Appends rows (m, H)."""
        end = self.rows + rows.shape[0]
        if end > self.buffer.shape[0]:
            capacity = self.buffer.shape[0]
            while capacity < end:
                capacity *= 2
            grown = self.buffer.new_empty(capacity, self.buffer.shape[1])
            grown[: self.rows] = self.buffer[: self.rows]
            self.buffer = grown
        self.buffer[self.rows : end] = rows
        self.rows = end


def _pass(
    head,
    cache: HeadCache,
    window: int,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    visible: torch.Tensor,
    rows: torch.Tensor,
    among: torch.Tensor | None = None,
) -> torch.Tensor:
    """One head pass over T new pairs, attending over the buffer's first `window` rows where `visible` (T, window)
    bool says, and over the new pairs where `among` (T, T) bool says (None: each over itself); their keys and
    values go to buffer rows `rows` (T,) int64. hidden (T, H), tokens (T,) token ids, positions (T,) int64.
    Returns the outputs (T, H)."""
    T = tokens.shape[0]
    past = (cache.keys[:, :, :window], cache.values[:, :, :window])
    if among is None:
        among = torch.eye(T, dtype=torch.bool, device=visible.device)
    mask = torch.cat([visible, among], dim=1)[None, None]  # (1, 1, T, window + T)
    out, (k, v) = head(hidden[None], tokens[None], positions[None], past=past, mask=mask)
    cache.keys.index_copy_(2, rows, k)
    cache.values.index_copy_(2, rows, v)
    return out[0]


def feed_pairs(
    head,
    cache: HeadCache,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    count: torch.Tensor,
    length: torch.Tensor,
    window: int,
) -> torch.Tensor:
    """Feeds the head the first `count` of T true pairs (hidden (T, H) features, tokens (T,) token ids), padded to
    a bucket of T: pair i takes position and buffer row length + i and sees the true pairs below `length` and the
    new pairs up to itself. Padding rows (i >= count) land past the true pairs, in scratch that no later query
    sees; the caller then adds count to the cache's length (the caller reserves T rows past it within `window`).
    count, length: () int64 on the device. Returns the head's output at the last real pair (H,)."""
    T = tokens.shape[0]
    new = torch.arange(T, device=hidden.device)
    rows = length + new
    visible = (torch.arange(window, device=hidden.device) < length)[None].expand(T, -1)
    causal = new[None] <= new[:, None]  # (T, T): real pairs never see the padding after them
    out = _pass(head, cache, window, hidden, tokens, rows, visible, rows, among=causal)
    return out.index_select(0, (count - 1).view(1))[0]


def draft_chain(head, cache: HeadCache, root: torch.Tensor, length: torch.Tensor, k: int, window: int) -> torch.Tensor:
    """The greedy chain of k tokens (k,) int64 (token ids) after the head's output `root` (H,) at the last true pair.

    length: () int64 on the device, the true pairs in the cache (the first draft's pair position); the chain's
    pairs are written to rows length .. length + k - 2 (the caller reserves them within `window`)."""
    keys = torch.arange(window, device=root.device)
    h, tokens = root[None], []
    for i in range(k):
        token = head.draft_ids[head.draft_logits(h).float().argmax(-1)]  # (1,)
        tokens.append(token)
        if i < k - 1:
            row = (length + i).view(1)
            h = _pass(head, cache, window, h, token, row, (keys < row)[None], row)
    return torch.cat(tokens)


def draft_tree(
    head, cache: HeadCache, root: torch.Tensor, length: torch.Tensor, depth: int, width: int, nodes: int, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree of `depth` levels x `width` candidates, of which the `nodes` most probable are returned as
    (token ids (nodes,) int64, parents (nodes,) int64 (-1: under the root; parents[i] < i), scores (nodes,)
    float32: the cumulative draft log-probabilities of their paths), in node order: by depth, then by score.

    Node n (level n // width + 1) writes its pair to buffer row length + n (the caller reserves depth x width
    rows within `window`); its pair position is length + its level - 1."""
    device = root.device
    total = depth * width
    keys = torch.arange(window, device=device)
    node_ids = torch.arange(total, device=device)
    rel = keys - length  # (window,): the tree node a buffer row holds, where 0 <= rel < total
    in_tree = (rel >= 0) & (rel < total)
    # ancestors[n, m]: node m is node n or one of its ancestors (filled level by level)
    ancestors = torch.zeros(total, total, dtype=torch.bool, device=device)
    logits = head.draft_logits(root[None]).float()  # (1, K)
    top = torch.topk(logits, width, dim=-1)
    scores = (top.values - torch.logsumexp(logits, -1, keepdim=True))[0]  # (W,), most probable first
    ids = top.indices[0]  # (W,) draft indices
    parents = torch.full((width,), NO_PARENT, dtype=torch.long, device=device)
    parent_hidden = root[None].expand(width, -1)  # (W, H): the hidden each frontier node's pair reads
    level_ids, level_parents, level_scores = [ids], [parents], [scores]
    ancestors[:width, :width] = torch.eye(width, dtype=torch.bool, device=device)
    for level in range(1, depth):
        first = (level - 1) * width  # the frontier's first node
        frontier = node_ids[first : first + width]
        strict = ancestors[frontier] & (node_ids[None] < first)  # (W, total): ancestors above the frontier
        seen_in_tree = strict.gather(1, rel.clamp(0, total - 1)[None].expand(width, -1)) & in_tree[None]
        visible = (rel < 0)[None] | seen_in_tree  # (W, window)
        positions = (length + level - 1).expand(width)
        out = _pass(head, cache, window, parent_hidden, head.draft_ids[ids], positions, visible, length + frontier)
        logits = head.draft_logits(out).float()  # (W, K)
        top = torch.topk(logits, width, dim=-1)
        step = top.values - torch.logsumexp(logits, -1, keepdim=True)  # (W, W)
        candidates = (scores[:, None] + step).flatten()  # (W * W,)
        kept = torch.topk(candidates, width)
        rank = kept.indices // width  # each kept candidate's frontier node (0..W-1)
        scores, ids = kept.values, top.indices.flatten()[kept.indices]
        parents = first + rank
        parent_hidden = out[rank]
        new = node_ids[level * width : (level + 1) * width]
        ancestors[new] = ancestors[parents] | (node_ids[None] == new[:, None])
        level_ids.append(ids)
        level_parents.append(parents)
        level_scores.append(scores)
    all_ids, all_parents, all_scores = torch.cat(level_ids), torch.cat(level_parents), torch.cat(level_scores)
    # the `nodes` most probable, ties to the earlier node: closed under ancestors (a child never scores above
    # its parent, log-probs being <= 0, and comes later)
    best = torch.sort(all_scores, descending=True, stable=True).indices[:nodes]
    chosen = torch.sort(best).values  # node order: by level, and within a level by score
    new_index = torch.full((total,), NO_PARENT, dtype=torch.long, device=device)
    new_index[chosen] = torch.arange(nodes, device=device)
    chosen_parents = all_parents[chosen]
    mapped = torch.where(chosen_parents >= 0, new_index[chosen_parents.clamp(min=0)], NO_PARENT)
    return head.draft_ids[all_ids[chosen]], mapped, all_scores[chosen]
