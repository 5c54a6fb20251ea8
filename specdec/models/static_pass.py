"""A shape-static pass of FastLlama: every input is a tensor whose shape depends only on its bucket, and nothing in it
reads a tensor's value on the host, so the same call can be captured once as a CUDA graph and replayed.

FastLlama's eager forward chooses its work from Python values that change every step (each row's cache length, a
slice of the cache up to the longest row's end, causal or masked attention, contiguous or scattered slots). Here
those values are tensors:
  - each token's cache row (`write_rows`) and position are inputs; a padding token writes to the slot's scratch row
    (the pool's last row, past every usable position), so padding never overwrites a live entry;
  - attention reads a fixed window of keys, the first `window` rows of each row's slot, and a mask built on the
    device from the cache lengths and the tree mask hides what a token may not see;
  - KV writes are index_put with tensor indices.
The per-layer math (norms, projections, RoPE, MLP) is FastLlama's own (_qkv, _finish_layer), so a token's logits
here are those of the eager pass up to the rounding of a longer attention reduction (tests/test_static_pass.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .ops import attend, soft_cap


@dataclass
class StaticInputs:
    """One bucket's inputs, B rows x T new tokens (the padded shape, fixed for the bucket).

    ids: (B, T) int64 token ids (padding: 0)
    positions: (B, T) int64 RoPE positions (a chain's: length + t; a tree node's: length + depth; padding: 0)
    write_rows: (B, T) int64 the cache row each token's key and value go to (padding: the scratch row)
    slots: (B,) int64 each row's KV slot (padding rows: any slot; they write its scratch row only)
    lengths: (B,) int64 cached tokens per row before this pass (padding rows: 0)
    tree: (B, T, T) bool which new tokens each new token sees, itself included (a chain's: lower triangle;
        padding rows and columns: False)
    """

    ids: torch.Tensor
    positions: torch.Tensor
    write_rows: torch.Tensor
    slots: torch.Tensor
    lengths: torch.Tensor
    tree: torch.Tensor

    @staticmethod
    def empty(batch: int, tokens: int, device: torch.device) -> "StaticInputs":
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.long, device=device)

        return StaticInputs(
            ids=longs(batch, tokens),
            positions=longs(batch, tokens),
            write_rows=longs(batch, tokens),
            slots=longs(batch),
            lengths=longs(batch),
            tree=torch.zeros(batch, tokens, tokens, dtype=torch.bool, device=device),
        )

    def copy_(self, other: "StaticInputs") -> None:
        """Copies other's values into these tensors in place (a captured graph reads these very tensors)."""
        for name in ("ids", "positions", "write_rows", "slots", "lengths", "tree"):
            getattr(self, name).copy_(getattr(other, name), non_blocking=True)


def visible_keys(inputs: StaticInputs, window: int, scratch_row: int) -> torch.Tensor:
    """(B, 1, T, window) bool: key row j is visible to new token t of row b when j < lengths[b] (cached), or j is
    the row lengths[b] + u of a new token u with tree[b, t, u] (live tokens write there; padding columns of tree are
    False). A padding token sees key row 0 only, so that no query row is all masked (a softmax over nothing is NaN,
    and NaN in a padding token's keys would reach live rows as 0 * NaN)."""
    B, T = inputs.ids.shape
    keys = torch.arange(window, device=inputs.ids.device)[None, :]  # (1, window)
    rel = keys - inputs.lengths[:, None]  # (B, window): the new token a key row holds, where 0 <= rel < T
    new_seen = inputs.tree.gather(2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, window))  # (B, T, window)
    visible = (rel < 0)[:, None, :] | (new_seen & (rel < T)[:, None, :])
    padding = inputs.write_rows == scratch_row  # (B, T)
    visible = visible | (padding[:, :, None] & (keys == 0)[:, None, :])
    return visible[:, None]


@torch.inference_mode()
def static_pass(
    model, inputs: StaticInputs, window: int, feature_layers: tuple[int, ...] = (), steps: "PassSteps | None" = None
):
    """Scores a bucket's tokens with `model` (a FastLlama whose pool has a scratch row) and writes their keys and
    values to its pool. Returns logits (B, T, V) and hidden (B, T, H + len(feature_layers) * H): the final hidden
    state, then each feature layer's input, as FastLlama.forward's output_hidden gives them. Cache lengths are the
    caller's to advance. window: key rows read per slot (<= the pool's capacity). steps: the pass's steps, plain
    (default) or compiled (compiled_pass.py)."""
    steps = steps or PLAIN_STEPS
    with steps.scope():
        x, masks, angles = steps.prologue(model, inputs, window)
        slot_rows = inputs.slots[:, None]  # (B, 1), broadcast against write_rows (B, T)
        features = {}  # layer -> its input (B, T, H)
        for li, layer in enumerate(model.layers):
            if li in feature_layers:
                features[li] = x
            q, k, v = steps.layer_in(model, layer, x, *angles[layer.rope_kind])  # k, v: (B, T, nkv, hd)
            # KV writes, the key window's gather and attention stay eager: they read the pool, whose in-place
            # writes a compiled graph would have to carry as mutations of its input
            kc, vc = model.pool.keys[li], model.pool.values[li]  # (S, nkv, P, hd)
            kc[slot_rows, :, inputs.write_rows] = k
            vc[slot_rows, :, inputs.write_rows] = v
            keys = kc[:, :, :window].index_select(0, inputs.slots)  # (B, nkv, window, hd)
            values = vc[:, :, :window].index_select(0, inputs.slots)
            attn = attend(q, keys, values, masks[layer.window], model.attn_scale, model.family.attn_softcap)
            x = steps.layer_out(model, layer, x, attn)
        return steps.epilogue(model, x, tuple(features[li] for li in feature_layers))


def prologue(model, inputs: StaticInputs, window: int):
    """The pass's start: the embedded tokens x (B, T, H), each sliding window's attention mask (0: none) {window:
    (B, 1, T, window) bool} and each RoPE table's angles {kind: (cos, sin), each (B, 1, T, rotated dims)}."""
    scratch_row = model.pool.capacity - 1
    visible = visible_keys(inputs, window, scratch_row)  # (B, 1, T, window)
    masks = {
        w: visible if not w else visible & within_window(inputs, window, w)  # per sliding window (0: none)
        for w in set(model.family.windows or (0,))
    }
    angles = {
        kind: (cos[inputs.positions].unsqueeze(1), sin[inputs.positions].unsqueeze(1))
        for kind, (cos, sin) in model.rope.items()
    }
    x = F.embedding(inputs.ids, model.embed)  # (B, T, H)
    if model.embed_scale is not None:
        x = x * model.embed_scale
    return x, masks, angles


def layer_in(model, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """A layer's queries, keys and values of x (B, T, H): FastLlama._qkv."""
    return model._qkv(layer, x, cos, sin)


def layer_out(model, layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """The residual stream (B, T, H) after a layer whose attention gave attn (B, nh, T, hd): FastLlama._finish_layer."""
    return model._finish_layer(layer, x, attn)


def epilogue(model, x: torch.Tensor, features: tuple[torch.Tensor, ...]):
    """logits (B, T, V) and hidden (B, T, H + len(features) * H) of the last layer's output x (B, T, H)."""
    x = model._final_norm(x)
    hidden = torch.cat((x,) + features, dim=-1)
    return soft_cap(model.lm_head(x), model.family.logit_softcap), hidden


@dataclass(frozen=True)
class PassSteps:
    """The static pass's steps apart from the KV writes and attention; each a function of tensors whose shapes
    depend on the bucket alone (the prologue's also on the key window). scope: the context they run in."""

    prologue: Callable
    layer_in: Callable
    layer_out: Callable
    epilogue: Callable
    scope: Callable[[], AbstractContextManager] = nullcontext


PLAIN_STEPS = PassSteps(prologue, layer_in, layer_out, epilogue)


def within_window(inputs: StaticInputs, window: int, sliding: int) -> torch.Tensor:
    """(B, 1, T, window) bool: key row j is within `sliding` positions before new token t of row b. A cached row's
    position is its row (the cache holds a sequence's positions in order); a new token's is its input position."""
    B, T = inputs.ids.shape
    keys = torch.arange(window, device=inputs.ids.device)[None, :]  # (1, window)
    rel = keys - inputs.lengths[:, None]  # (B, window)
    new = (rel >= 0) & (rel < T)
    key_positions = torch.where(new, inputs.positions.gather(1, rel.clamp(0, T - 1)), keys)  # (B, window)
    return (inputs.positions[:, :, None] - key_positions[:, None, :] < sliding)[:, None]
