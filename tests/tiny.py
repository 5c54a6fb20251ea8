"""Tiny models for tests: random Llama models (float32) and a table-based toy LM for statistics."""
from __future__ import annotations

from pathlib import Path

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.models.backend import CausalLM, ForwardOutput, ModelInfo, SequenceCache
from specdec.models.backend_choice import make_backend
from specdec.models.loading import LoadedModel, model_info


def tiny_llama(seed: int = 0, vocab: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               init_range: float = 0.3, max_positions: int = 512):
    """A random LlamaForCausalLM in float32 whose logits are spread out (few near-ties)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                         initializer_range=init_range, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=vocab - 1, pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def loaded(hf_model, backend: str = "torch", name: str = "tiny", tokenizer=None, dtype=torch.float32,
           slots: int = 1, graphs: str = "auto", compile: str = "auto") -> LoadedModel:
    """Wraps a model (already in `dtype`) in a backend whose KV pool starts with `slots` sequences (graphs: on runs
    the torch backend's passes shape-static, uncaptured on the CPU; compile: on compiles them). A test that asks for the CPU kernels is skipped
    where they cannot run (a CPU without AVX2, or no compiler)."""
    if backend.startswith("kernels"):
        from specdec.kernels import unavailable_reason

        reason = unavailable_reason()
        if reason:
            import pytest

            pytest.skip(f"the CPU kernels cannot run here: {reason}")
    info = model_info(name, hf_model, tokenizer or _NoTokenizer(hf_model), torch.device("cpu"), dtype)
    return LoadedModel(name=name, hf_model=hf_model, tokenizer=tokenizer,
                       backend=make_backend(hf_model, info, backend, slots, graphs=graphs, compile=compile))


def drafted_keeping_greedy_output(decoder, target, lengths=(3, 9, 20), new_tokens: int = 30) -> int:
    """Runs random prompts of these lengths through `decoder` and plain decoding of `target`, asserts the tokens
    are the same, and returns how many tokens were drafted."""
    from specdec.config import GenerationConfig
    from specdec.engine import SpecDecoder

    baseline = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
    gen = torch.Generator().manual_seed(3)
    drafted = 0
    for n in lengths:
        prompt = torch.randint(0, target.info.vocab_size - 1, (n,), generator=gen).tolist()
        got, metrics = decoder.generate_ids(prompt, config)
        assert got == baseline.generate_ids(prompt, config)[0]
        drafted += metrics.drafted_tokens
    return drafted


def random_medusa_heads(model, num_heads: int = 4, seed: int = 1):
    """Medusa heads for a tiny Llama with random blocks (a fresh head is the target's LM head on f_t: it would
    draft x_{t+1} again)."""
    from specdec.drafters.heads.medusa_head import new_medusa_heads

    torch.manual_seed(seed)
    heads = new_medusa_heads(model, "tiny", torch.arange(model.config.vocab_size), num_heads=num_heads)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    return heads


class _NoTokenizer:
    def __init__(self, model):
        self.eos_token_id = model.config.eos_token_id


WORDS = ("the a cat dog sat on mat and ran to see big small red blue green house tree sun moon star sky "
         "is was be it he she they we you I of in at for with by from up down over under again then").split()


def write_tiny_model_folder(folder: Path, seed: int = 0, words: list[str] = WORDS, hidden: int = 32,
                            layers: int = 2) -> Path:
    """A complete local transformers folder (config, safetensors weights, word-level tokenizer, chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(words))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    model = tiny_llama(seed=seed, vocab=len(vocab), hidden=hidden, layers=layers)
    model.config.eos_token_id = vocab["</s>"]
    model.generation_config.eos_token_id = vocab["</s>"]
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def write_tiny_bpe_folder(folder: Path, seed: int = 0, hidden: int = 64, missing: str = "") -> Path:
    """Like write_tiny_model_folder, with a byte-level BPE tokenizer (as GPT-2's, Llama 3's and SmolLM2's) trained on
    a few sentences and JSON snippets: the kind structured output (llguidance) reads token bytes from. missing: the
    byte-level characters its vocabulary lacks (SmolLM2's lacks some control bytes, such as 0x04, "Ą")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(12)) + f' {{"name": "{WORDS[i % 40]}", '
              f'"age": {i}, "tags": ["a", "b"]}}' for i in range(300)]
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet() if c not in missing]
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                         initial_alphabet=alphabet))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    model = tiny_llama(seed=seed, vocab=core.get_vocab_size(), hidden=hidden)
    model.config.eos_token_id = model.generation_config.eos_token_id = core.token_to_id("</s>")
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


class TableLM(CausalLM):
    """A toy LM whose next-token logits depend only on the previous two tokens: table[(a, b)] -> (V,).

    Its forward costs microseconds, so the engine can draw 10^4 samples in seconds. Its "hidden state" at a
    position is a fixed random vector of the same two tokens (for drafters that read features).
    """

    def __init__(self, vocab: int = 5, seed: int = 0, scale: float = 1.5, eos: tuple[int, ...] = (), hidden: int = 8):
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=gen) * scale  # (prev2, prev1) -> logits
        self.features = torch.randn(vocab, vocab, hidden, generator=gen)  # (prev2, prev1) -> hidden state
        self.info = ModelInfo(name=f"table-{seed}", model_type="table", vocab_size=vocab, hidden_size=hidden, num_layers=1,
                              max_context=4096, eos_token_ids=eos, device=torch.device("cpu"), dtype=torch.float32)

    def logits_after(self, tokens: list[int]) -> torch.Tensor:
        a = tokens[-2] if len(tokens) > 1 else 0
        return self.table[a, tokens[-1]]

    def hidden_after(self, tokens: list[int]) -> torch.Tensor:
        a = tokens[-2] if len(tokens) > 1 else 0
        return self.features[a, tokens[-1]]

    def new_cache(self) -> SequenceCache:
        return SequenceCache(length=0, state=[])

    def forward(self, cache, input_ids, *, tree_mask=None, output_hidden=False, last_only=False, layers=None,
                feature_layers=(), argmax_only=False):
        tokens: list[int] = cache.state
        new = input_ids.tolist()
        rows, hidden = [], []
        for i, t in enumerate(new):
            seen = [new[j] for j in range(i + 1) if tree_mask is None or tree_mask[i, j]]  # ancestors and itself
            rows.append(self.logits_after(tokens + seen))
            hidden.append(self.hidden_after(tokens + seen))
        tokens.extend(new)
        cache.length = len(tokens)
        logits = torch.stack(rows)
        return ForwardOutput(logits=logits[-1:] if last_only else logits,
                             hidden=torch.stack(hidden) if output_hidden else None)

    def truncate(self, cache, length):
        del cache.state[length:]
        cache.length = len(cache.state)

    def compact(self, cache, start, keep):
        kept = [cache.state[start + i] for i in keep]
        del cache.state[start:]
        cache.state.extend(kept)
        cache.length = len(cache.state)


def table_target(vocab: int = 5, seed: int = 0, scale: float = 1.5) -> LoadedModel:
    lm = TableLM(vocab, seed, scale)
    return LoadedModel(name=lm.info.name, hf_model=None, tokenizer=None, backend=lm)




class TableTreeDrafter(Drafter):
    """A test drafter: a deterministic tree (top `width` tokens per node, `depth` levels) from a draft table; where a
    step allows no tree, the chain of top-1 tokens."""

    name = "table-tree"
    sizing = "tree"

    def __init__(self, lm: TableLM, width: int = 2, depth: int = 2):
        self.lm, self.width, self.depth = lm, width, depth

    def propose(self, context, budget):
        width = self.width if budget.tree else 1
        tokens, parents, frontier = [], [], [(-1, list(context))]
        for _ in range(min(self.depth, budget.k)):
            nxt = []
            for node, ctx in frontier:
                for t in torch.topk(self.lm.logits_after(ctx), width).indices.tolist():
                    tokens.append(t)
                    parents.append(node)
                    nxt.append((len(tokens) - 1, ctx + [t]))
            frontier = nxt
        return Draft(tokens=torch.tensor(tokens), parents=parents if budget.tree else None)


class ModelLogits:
    """logits_after(tokens) -> (V,) of a transformers model, so that TableTreeDrafter can draft from it."""

    def __init__(self, hf_model):
        self.hf_model = hf_model

    @torch.no_grad()
    def logits_after(self, tokens: list[int]) -> torch.Tensor:
        return self.hf_model(torch.tensor([tokens])).logits[0, -1]


def loss_after_training(head, objective, batch, settings, vocab_index, lr: float = 3e-3, steps: int = 30):
    """(loss before, loss after) `steps` AdamW steps of `objective` (eagle_trainer.unrolled_losses or alike) on
    one collated batch."""
    def loss():
        with torch.no_grad():
            return float(sum(objective(head, batch, settings, vocab_index, train=False)[0]))

    before = loss()
    opt = torch.optim.AdamW(head.parameters(), lr=lr)
    for _ in range(steps):
        total = sum(objective(head, batch, settings, vocab_index)[0])
        opt.zero_grad()
        total.backward()
        opt.step()
    return before, loss()


def kernel_head(head):
    """An EAGLE head whose products run on the CPU kernels (KernelEagleHead over the same weights); the test is
    skipped where the kernels cannot run this head."""
    import pytest

    from specdec.drafters.heads.eagle_kernels import KernelEagleHead, kernel_head_problem

    problem = kernel_head_problem(head.config)
    if problem:
        pytest.skip(f"the CPU kernels cannot run here: {problem}")
    return KernelEagleHead(head)


def ragged_prompts(n: int = 12, vocab: int = 64) -> list[list[int]]:
    """n prompts of 2, 5, 8, ... tokens (seeded), every other one ending with a repeat of its first half, so that
    prompt lookup finds drafts in some and not in others."""
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        p = torch.randint(0, vocab - 1, (2 + 3 * i,), generator=gen).tolist()
        out.append(p + p[: len(p) // 2] if i % 2 else p)
    return out
