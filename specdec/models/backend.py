"""The backend contract: a causal LM that keeps per-sequence KV caches and can roll them back.

Implementations: `HFBackend` runs any transformers causal LM; `FastLlama` (llama.py) and `KernelLlama`
(kernel_llama.py) run the Llama family over a pool of cache slots (kvpool.py), with less overhead; models/ holds
others. The engine only sees this contract, capabilities included: a backend declares them (prefix_cache,
copies_caches), nobody probes for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (T, V) for the scored positions, in the model's dtype
    # (T, H) final hidden state, after the final norm (the LM head's input); with feature layers (A of them),
    # (T, H + A*H): that state, then the input of each feature layer in turn (CausalLM.forward's feature_layers)
    hidden: torch.Tensor | None = None


@dataclass
class SequenceCache:
    """One sequence's KV state inside a backend. `length` tokens are cached, at positions 0..length-1."""

    length: int = 0
    slot: int = 0
    state: object = None
    #: part of its prompt is cached (a prefix restored from the prefix cache, or the chunks of a chunked prefill so
    #: far): its next pass goes on with the prompt's prefill
    in_prompt: bool = False


@dataclass(frozen=True)
class ModelInfo:
    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype


class CausalLM(ABC):
    """A causal LM with rollback-able KV caches. Every tensor is for one sequence (batch of 1)."""

    info: ModelInfo
    #: True when one forward over several sequences (forward_batch) is a real batched pass.
    batched: bool = False
    #: The prefix cache (prefix_cache.py) that keeps finished sequences' caches for later prompts with the same
    #: beginning, once enable_prefix_cache made one; None: none (always, for a backend without cache slots).
    prefix_cache: Any = None
    #: True when copy_cache works: sequences with the same prompt prefill it once.
    copies_caches: bool = False
    #: The shape-static passes (pass_graphs.py: CUDA graphs where captured) that run its decode and verify passes,
    #: or None: eager passes only (always, for a backend without them).
    pass_graphs: Any = None
    #: True when passes asked for argmaxes only (forward's argmax_only) find them from an 8-bit copy of the LM head
    #: and compute exactly only the outputs that may be a row's maximum (the CPU kernels' screen).
    screened_head: bool = False
    #: True when forward runs its first `layers` decoder layers only (early exit, for layer-skip drafting).
    early_exit: bool = False
    #: True when a prompt prefilled in several passes (chunks, each continuing a cache marked in_prompt) gives every
    #: row the keys, values and logits that one pass would, bit for bit: chunked prefill changes no output.
    exact_chunks: bool = False
    #: The GGUF types of the matrices it runs in a file's own formats (Q4_1, Q8_0...); none: float weights.
    weight_types: Sequence[str] = ()
    #: True when it runs a GGUF file's quantized weights as they are (weight_types), not as floats.
    quantized_weights: bool = False

    def enable_prefix_cache(self, max_entries: int) -> bool:
        """Keeps up to `max_entries` finished sequences' caches (0: none); False where nothing is cached (a backend
        without cache slots, this default)."""
        return False

    def exact_prefix_rows(self, cache: SequenceCache, prompt_len: int) -> int:
        """How many of a finished sequence's first cached positions (prompt_len of them its prompt's) a later
        prefill would compute identically, so that the prefix cache may keep them: all, unless the backend
        computes prefills differently from later passes."""
        return cache.length

    def copy_cache(self, src: SequenceCache, dst: SequenceCache, length: int | None = None) -> None:
        """dst (a fresh cache) gets src's first `length` keys and values (default: all); where copies_caches."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy a cache")

    @abstractmethod
    def new_cache(self) -> SequenceCache: ...

    def release(self, cache: SequenceCache) -> None:
        """Frees the cache's memory or slot."""

    @abstractmethod
    def forward(
        self,
        cache: SequenceCache,
        input_ids: torch.Tensor,
        *,
        tree_mask: torch.Tensor | None = None,
        output_hidden: bool = False,
        last_only: bool = False,
        layers: int | None = None,
        feature_layers: tuple[int, ...] = (),
        argmax_only: bool = False,
    ) -> ForwardOutput:
        """Scores `input_ids` (T,) appended to the cache, and caches their keys and values.

        Token t sits at position cache.length + t, or with a tree_mask (T, T) bool (row t: which new
        tokens token t sees, itself included) at cache.length + depth(t), depth = ancestors seen.
        Returns logits (T, V), or (1, V) for the last token with last_only. cache.length grows by T.
        layers: run only the first `layers` decoder layers, then the final norm and LM head (early exit).
        output_hidden: also return the final hidden state (T, H), followed by the inputs of `feature_layers` (the
        residual stream before layer i: transformers' hidden_states[i]), (T, H + A*H) for A of them, in that order,
        for heads that read several depths (EAGLE-3). Asked for per call: the model keeps no such setting.
        argmax_only: the caller reads each row's argmax (the first of equal maxima) and nothing else of the logits;
        a backend may then return -inf where a row's maximum cannot be, the argmax and its logit as without
        (the CPU kernels' screened LM head). Others return the logits in full.
        """

    @abstractmethod
    def truncate(self, cache: SequenceCache, length: int) -> None:
        """Rolls the cache back to its first `length` tokens; rejected entries are dropped."""

    def compact(self, cache: SequenceCache, start: int, keep: list[int]) -> None:
        """Keeps, of the entries from `start` on, those at offsets `keep` (ascending), moved to start.."""
        raise NotImplementedError(f"{type(self).__name__} cannot compact a tree into a path")

    def forward_batch(
        self,
        caches: list[SequenceCache],
        input_ids: list[torch.Tensor],
        *,
        output_hidden: bool = False,
        last_only: bool = False,
        layers: int | None = None,
        feature_layers: tuple[int, ...] = (),
        argmax_only: bool = False,
    ) -> list[ForwardOutput]:
        """Scores several sequences (last_only: logits (1, V) of each one's last token, as for a prefill);
        the default runs them one after another."""
        return [
            self.forward(
                c,
                ids,
                output_hidden=output_hidden,
                last_only=last_only,
                layers=layers,
                feature_layers=feature_layers,
                argmax_only=argmax_only,
            )
            for c, ids in zip(caches, input_ids)
        ]


def check_feature_layers(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """`layers` as a tuple, when each is one of the model's `num_layers` layers and none repeats; else ConfigError."""
    from ..errors import ConfigError

    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ConfigError(f"feature layer {bad[0]} is outside the target's {num_layers} layers")
    if len(set(layers)) != len(layers):
        raise ConfigError(f"feature layers repeat: {list(layers)}")
    return tuple(layers)


def tree_positions(tree_mask: torch.Tensor) -> torch.Tensor:
    """Depth of each node of a tree mask (T, T) bool, where row t marks t's ancestors and t: (T,) int64."""
    return tree_mask.sum(-1).long() - 1


class HFBackend(CausalLM):
    """Any transformers causal LM, with a DynamicCache cropped on rollback."""

    def __init__(self, model, info: ModelInfo):
        self.model = model
        self.info = info

    def new_cache(self) -> SequenceCache:
        from transformers import DynamicCache

        return SequenceCache(length=0, state=DynamicCache(config=self.model.config))

    @torch.inference_mode()
    def forward(
        self,
        cache,
        input_ids,
        *,
        tree_mask=None,
        output_hidden=False,
        last_only=False,
        layers=None,
        feature_layers=(),
        argmax_only=False,
    ):
        if layers is not None:
            from ..errors import ConfigError

            raise ConfigError("early exit (layer skip) needs the kernels or torch backend, not transformers' forward")
        device = self.info.device
        ids = input_ids.to(device).view(1, -1)
        T = ids.shape[1]
        start = cache.length
        cache_position = torch.arange(start, start + T, device=device)
        kwargs = {}
        if tree_mask is not None:
            positions = start + tree_positions(tree_mask.to(device))
            visible = torch.ones(T, start + T, dtype=torch.bool, device=device)
            visible[:, start:] = tree_mask.to(device)
            bias = torch.zeros(visible.shape, dtype=self.info.dtype, device=device)
            kwargs["attention_mask"] = bias.masked_fill_(~visible, torch.finfo(self.info.dtype).min)[None, None]
            kwargs["position_ids"] = positions[None]
        else:
            kwargs["position_ids"] = cache_position[None]
        out = self.model(
            input_ids=ids,
            past_key_values=cache.state,
            use_cache=True,
            cache_position=cache_position,
            output_hidden_states=output_hidden,
            logits_to_keep=1 if last_only else 0,
            **kwargs,
        )
        cache.length = start + T
        hidden = None
        if output_hidden:
            states = out.hidden_states
            hidden = torch.cat([states[-1][0]] + [states[i][0] for i in feature_layers], dim=-1)
        return ForwardOutput(logits=out.logits[0], hidden=hidden)

    def truncate(self, cache, length):
        if length < cache.length:
            cache.state.crop(length - cache.length)  # negative: tokens to remove (transformers 4 and 5)
            cache.length = length

    @torch.inference_mode()
    def compact(self, cache, start, keep):
        index = torch.tensor([start + i for i in keep], device=self.info.device)
        for layer in cache.state.layers:
            layer.keys[:, :, start : start + len(keep)] = layer.keys.index_select(2, index)
            layer.values[:, :, start : start + len(keep)] = layer.values.index_select(2, index)
        self.truncate(cache, start + len(keep))
