"""The Llama family on specdec's CPU kernels (../kernels/cpu_llama.cpp).

Weights stay in the model's dtype (float32, bfloat16 or float16); every activation and the logits are
float32. So is the KV cache, unless asked for in bfloat16 (kernels-bf16kv, bfloat16 weights only): half the
memory and the bytes every pass reads at a long context, for outputs a little further from float32's. Results
do not depend on how many tokens or sequences one pass scores, so a verify pass over k drafts returns exactly
what k one-token passes would: speculation is bit-exact.

Matrix products multiply float32 activations, except where bfloat16 products are asked for: in every
pass (kernels-bf16), or in a sequence's first pass only (its prompt, where the products are
compute-bound: the default for bfloat16 weights on a CPU with AVX-512 BF16). A prompt is prefilled
the same way whatever shares its pass, so plain and speculative decoding still agree token for token.
"""

from __future__ import annotations

import itertools

import torch

from .backend import CausalLM, ForwardOutput, ModelInfo, SequenceCache, tree_positions
from .kernel_args import head_dim_of, kernel_model_args, kernel_shape_problem
from .kvpool import KVPool, PooledCaches
from .quantized_args import packed_arguments, quantized_kinds


class KernelLlama(PooledCaches, CausalLM):
    """Llama family on the CPU kernels; KV cache (layers, slots, kv_heads, capacity, head_dim), float32 or
    bfloat16."""

    batched = True
    early_exit = True
    exact_chunks = True  # batch-invariant kernels; a chunk after the first still prefills (_first_pass)

    def __init__(
        self,
        hf_model,
        info: ModelInfo,
        slots: int = 1,
        max_context: int | None = None,
        bf16_products: bool = False,
        bf16_prefill: bool | None = None,
        bf16_cache: bool = False,
        screened_head: bool = True,
        state: dict | None = None,
    ):
        """bf16_products: with bfloat16 weights, round activations to bfloat16 at each product's input and sum
        pairs of products in float32 (AVX-512 BF16); twice the arithmetic rate for verify passes.
        bf16_prefill: the same for each sequence's first pass only (None: wherever the weights and CPU allow,
        unless SPECDEC_BF16_PREFILL=off: kernels.bf16_prefill_wanted).
        bf16_cache: the KV cache in bfloat16 (keys and values rounded to nearest even as they are written); bfloat16
        weights only.
        screened_head: keep the LM head a second time at 8 bits (vocab x hidden bytes), so that passes asked for
        argmaxes only read it instead of the full head and compute exactly only the outputs that may be a row's
        maximum (kernels/argmax_screen.h): the same argmax, for about half the head's bytes.
        state: the weights by transformers' names instead of hf_model's (then a skeleton on the meta device, for its
        config and RoPE tables): a GGUF file's, whose quantized matrices the kernels keep in their formats
        (gguf_model.py); such a model is its own quantized copy, and its LM head is never screened."""
        from ..errors import ConfigError
        from ..kernels import bf16_prefill_wanted, has_bf16_products, load

        bf16_ready = info.dtype == torch.bfloat16 and has_bf16_products()
        if bf16_cache and info.dtype != torch.bfloat16 and state is None:
            raise ConfigError(
                "a bfloat16 KV cache (the kernels-bf16kv backend) needs --dtype bfloat16 or a quantized GGUF file"
            )
        if bf16_products and not bf16_ready:
            raise ConfigError(
                "bfloat16 products (the kernels-bf16 backend) need --dtype bfloat16 and a CPU with AVX-512 BF16"
            )
        self.bf16_prefill = (bf16_prefill_wanted() if bf16_prefill is None else bf16_prefill) and bf16_ready
        module = load()
        cfg = hf_model.config
        if info.device.type != "cpu":
            raise ValueError("the CPU kernels run on the CPU")
        self.info = info
        nkv = cfg.num_key_value_heads
        hd = head_dim_of(cfg)
        problem = kernel_shape_problem(cfg)
        if problem:
            raise ValueError(problem)
        self.head_dim, self.kv_heads = hd, nkv
        self.max_context = -(-min(max_context or info.max_context, info.max_context) // 16) * 16
        self.bf16_products = bf16_products
        args = kernel_model_args(hf_model, self.max_context, state)
        self.weight_types = quantized_kinds(args)  # a GGUF file's quantized types kept as they are
        self.quantized_weights = bool(self.weight_types)
        packing: list = []
        if self.quantized_weights:
            args, packing = packed_arguments(module, args)
            # the embeddings' and the head's bytes, for drafters that read them as floats (float_matrix)
            self._tables = {"embed": (args[3], packing[-2]), "head": (args[5], packing[-1])}
        self.model = module.CpuLlama(*args, bf16_products or self.bf16_prefill, False, screened_head, packing)
        # a head whose inner size is whole groups of 32, finite and without a final soft cap (argmax_screen.h),
        # outside passes with bfloat16 products
        self.screened_head = self.model.screened and not bf16_products
        self._hf_model = hf_model  # for four_bit_copy
        # Only rows below a sequence's length are ever read, so the cache can start uninitialised.
        kv_dtype = torch.bfloat16 if bf16_cache else torch.float32
        self.pool = KVPool(cfg.num_hidden_layers, slots, nkv, self.max_context, hd, kv_dtype, info.device, zeroed=False)

    def four_bit_copy(self):
        """The same model with 4-bit layers and a screened LM head (kernels/quantized.h), on this one's RoPE tables: a
        CpuLlama whose passes read about a third of bfloat16's bytes and approximate this model's, for drafting on
        this backend's KV caches."""
        from ..errors import ConfigError
        from ..kernels import load

        if self.quantized_weights:
            raise ConfigError(
                "the quantized drafter copies float weights: this model's are already quantized "
                "(pass --dequantize to run a GGUF file's weights as floats)"
            )
        return load().CpuLlama(*kernel_model_args(self._hf_model, self.max_context), False, True, False)

    @property
    def head_tied(self) -> bool:
        """Whether a quantized model's LM head is its embeddings' table (one set of bytes)."""
        return self._tables["head"][0] is self._tables["embed"][0]

    def float_matrix(self, which: str) -> torch.Tensor:
        """A quantized model's embeddings (`which` "embed") or LM head ("head") as float32 (vocab, hidden): the
        values the file defines, widened from the kernels' bytes (for drafters built on them, EAGLE's heads)."""
        from ..kernels import load

        table, packing = self._tables[which]
        if not packing:
            return table.float()
        fmt, rows, inner, _ = packing
        return load().packed_rows(table, fmt, rows, inner)

    @torch.inference_mode()
    def compact(self, cache: SequenceCache, start: int, keep: list[int]) -> None:
        # the kernels store keys in blocks of 16 positions, so they move entries themselves
        self.model.compact(self.pool.keys, self.pool.values, cache.slot, start, list(keep))
        cache.length = start + len(keep)

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
        ids = input_ids.reshape(-1).to(torch.long).cpu()
        T = ids.numel()
        if tree_mask is not None:
            positions = cache.length + tree_positions(tree_mask.cpu())
            masks = tree_mask.cpu().to(torch.uint8).reshape(1, T, T).contiguous()
        else:
            positions = torch.arange(cache.length, cache.length + T)
            masks = _NO_MASKS
        rows = torch.tensor([T - 1]) if last_only else torch.arange(T)
        logits, hidden = self._run(
            [cache], ids, [T], positions, masks, rows, layers, output_hidden, feature_layers, argmax_only
        )
        return ForwardOutput(logits=logits, hidden=hidden if output_hidden else None)

    @torch.inference_mode()
    def forward_batch(
        self,
        caches,
        input_ids,
        *,
        output_hidden=False,
        last_only=False,
        layers=None,
        feature_layers=(),
        argmax_only=False,
    ):
        fresh = [_first_pass(c) for c in caches]
        if self.bf16_prefill and not self.bf16_products and any(fresh) and not all(fresh):
            # first passes and later ones multiply differently: two passes, each as it would run alone
            parts = [[i for i, f in enumerate(fresh) if f == want] for want in (True, False)]
            outs = [
                self.forward_batch(
                    [caches[i] for i in part],
                    [input_ids[i] for i in part],
                    output_hidden=output_hidden,
                    last_only=last_only,
                    layers=layers,
                    feature_layers=feature_layers,
                    argmax_only=argmax_only,
                )
                for part in parts
            ]
            merged = dict(zip(parts[0] + parts[1], outs[0] + outs[1]))
            return [merged[i] for i in range(len(caches))]
        lengths = [int(ids.numel()) for ids in input_ids]
        ids = torch.cat([i.reshape(-1).to(torch.long).cpu() for i in input_ids])
        positions = torch.cat([torch.arange(c.length, c.length + n) for c, n in zip(caches, lengths)])
        ends = torch.tensor(lengths).cumsum(0)
        rows = ends - 1 if last_only else torch.arange(ids.numel())  # the LM head runs on these rows only
        logits, hidden = self._run(
            caches, ids, lengths, positions, _NO_MASKS, rows, layers, output_hidden, feature_layers, argmax_only
        )
        out = []
        for s, (n, end) in enumerate(zip(lengths, ends.tolist())):
            scored = logits[s : s + 1] if last_only else logits[end - n : end]
            out.append(ForwardOutput(logits=scored, hidden=hidden[end - n : end] if output_hidden else None))
        return out

    def _run(
        self,
        caches: list[SequenceCache],
        ids,
        lengths,
        positions,
        masks,
        rows,
        layers=None,
        output_hidden: bool = False,
        feature_layers: tuple[int, ...] = (),
        argmax_only: bool = False,
    ):
        """One kernel pass; hidden holds the inputs of feature_layers too when output_hidden (and no early exit)."""
        offsets = torch.tensor(list(itertools.accumulate(lengths, initial=0)))
        for c, n in zip(caches, lengths):
            if c.length + n > self.max_context:
                raise ValueError(f"sequence of {c.length + n} tokens exceeds the cache's {self.max_context}")
        bf16 = self.bf16_products or (self.bf16_prefill and all(_first_pass(c) for c in caches))
        aux_wanted = feature_layers if output_hidden and not layers else ()
        aux_layers = torch.tensor(aux_wanted, dtype=torch.long) if aux_wanted else _NO_LAYERS
        logits, hidden, aux = self.model.forward(
            ids,
            offsets,
            torch.tensor([c.slot for c in caches]),
            torch.tensor([c.length for c in caches]),
            positions.to(torch.long),
            masks,
            self.pool.keys,
            self.pool.values,
            rows,
            layers or 0,
            bf16,
            aux_layers,
            argmax_only,
        )
        if aux.numel():
            hidden = torch.cat([hidden, aux], dim=-1)
        for c, n in zip(caches, lengths):
            c.length += n
            c.in_prompt = False
        return logits, hidden

    def exact_prefix_rows(self, cache: SequenceCache, prompt_len: int) -> int:
        """With bfloat16 products for prefills only, a sequence's later passes computed its other rows
        differently from how a prefill would: only the prompt's rows are a prefill's."""
        if self.bf16_prefill and not self.bf16_products:
            return min(cache.length, prompt_len)
        return cache.length


# a pass without a tree's masks, and one that returns no feature layers (read only, made once)
_NO_MASKS, _NO_LAYERS = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.long)


def _first_pass(cache: SequenceCache) -> bool:
    """Whether a pass is (part of) the sequence's prefill: its first, or one that goes on with a prompt whose first
    part is cached (restored from the prefix cache, or prefilled in earlier chunks)."""
    return cache.length == 0 or cache.in_prompt
