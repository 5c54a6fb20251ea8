"""Medusa heads: drafting (chains and trees) keeps the target's output, both file layouts load, bad ones are refused."""
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.base import Budget, DraftRequest
from specdec.drafters.heads.medusa import MedusaDrafter
from specdec.drafters.heads.medusa_head import load_medusa_heads
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError, IncompatibleDraftError, ModelLoadError
from specdec.costs import CostModel
from tiny import drafted_keeping_greedy_output, loaded, random_medusa_heads, tiny_llama

def flat() -> CostModel:
    """Verification as on a GPU: trees of any size pay (a new model each time: decoders update theirs)."""
    return CostModel({1: 0.010, 64: 0.0101})


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


def started(drafter, target, prompt):
    """The drafter after the target's prefill of prompt[:-1], the context's last token being its choice."""
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt[:-1]), output_hidden=True)
    drafter.begin(DraftRequest(prompt_ids=prompt, costs=flat()))
    drafter.observe(out.hidden)
    return drafter


@pytest.mark.parametrize("backend", ["kernels", "torch", "hf"])
@pytest.mark.parametrize("tree", [False, True])
def test_medusa_drafting_keeps_greedy_output(model, backend, tree):
    target = loaded(model, backend)
    drafter = MedusaDrafter(random_medusa_heads(model), tree=tree, width=3)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False),
                          costs=flat())
    assert drafted_keeping_greedy_output(decoder, target) > 0


def test_heads_guess_from_the_feature_that_gave_the_last_token(model):
    target = loaded(model, "torch")
    heads = random_medusa_heads(model)
    prompt = list(range(5, 17))
    drafter = started(MedusaDrafter(heads, tree=False), target, prompt)
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt[:-1]), output_hidden=True)
    want = heads.draft_logits(heads(out.hidden[-1]))[:3].argmax(-1)  # head d's best guess, d = 1..3
    assert drafter.propose(prompt, Budget(3, tree=True)).tokens.tolist() == want.tolist()
    assert len(drafter.propose(prompt + [1], Budget(3, tree=True))) == 0  # that context's last feature is unknown


def test_tree_is_most_probable_first_and_a_width_one_tree_is_the_chain(model):
    target = loaded(model, "torch")
    heads = random_medusa_heads(model)
    prompt = list(range(5, 17))
    budget = Budget(4, tree=True)
    chain = started(MedusaDrafter(heads, tree=False), target, prompt).propose(prompt, budget)
    line = started(MedusaDrafter(heads, tree=True, width=1, lookup=False), target, prompt).propose(prompt, budget)
    assert line.parents == [-1, 0, 1, 2] and line.tokens.tolist() == chain.tokens.tolist()

    tree = started(MedusaDrafter(heads, tree=True, width=3, lookup=False), target, prompt).propose(prompt, budget)
    assert len(tree) > 4 and all(p < i for i, p in enumerate(tree.parents))
    logp = torch.log_softmax(heads.draft_logits(heads(started(MedusaDrafter(heads), target, prompt).last)), -1)
    depth_of = []
    for i, p in enumerate(tree.parents):
        depth_of.append(1 if p < 0 else depth_of[p] + 1)
        top = torch.topk(logp[depth_of[i] - 1], 3).indices.tolist()
        assert int(tree.tokens[i]) in top  # a node at depth d is one of head d's three best tokens
    # siblings are distinct, and the most probable path is the chain
    for p in set(tree.parents):
        kids = [int(tree.tokens[i]) for i, q in enumerate(tree.parents) if q == p]
        assert len(kids) == len(set(kids))
    assert [int(tree.tokens[i]) for i in range(len(tree)) if tree.parents[i] == -1][0] == int(chain.tokens[0])


def _write_medusa_layout(folder, model, num_heads=2, layers=1, vllm_names=False, **config_extra):
    """A folder in Medusa's own layout (FasterDecoding's keys, or vLLM's), with random weights."""
    H, V = model.config.hidden_size, model.config.vocab_size
    gen = torch.Generator().manual_seed(7)
    tensors = {}
    for i in range(num_heads):
        for j in range(layers):
            w, b = torch.randn(H, H, generator=gen) * 0.1, torch.randn(H, generator=gen) * 0.1
            names = (f"blocks.{i}.layers.{j}.weight", f"blocks.{i}.layers.{j}.bias") if vllm_names else \
                (f"{i}.{j}.linear.weight", f"{i}.{j}.linear.bias")
            tensors[names[0]], tensors[names[1]] = w, b
        tensors[f"lm_heads.{i}.weight" if vllm_names else f"{i}.{layers}.weight"] = torch.randn(V, H, generator=gen)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny",
              "hidden_size": H, "vocab_size": V, **config_extra}
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


@pytest.mark.parametrize("vllm_names", [False, True])
def test_medusa_layout_loads_and_computes_what_medusa_does(model, tmp_path, vllm_names):
    tensors = _write_medusa_layout(tmp_path / "m", model, vllm_names=vllm_names)
    heads = load_medusa_heads(tmp_path / "m", loaded(model, "torch"))
    assert heads.config.num_heads == 2 and not heads.config.shares_lm_head
    x = torch.randn(3, model.config.hidden_size)
    got = heads.draft_logits(heads(x))  # (3, heads, V)
    for i in range(2):
        w, b, lm = (tensors[f"blocks.{i}.layers.0.weight"], tensors[f"blocks.{i}.layers.0.bias"],
                    tensors[f"lm_heads.{i}.weight"]) if vllm_names else \
            (tensors[f"{i}.0.linear.weight"], tensors[f"{i}.0.linear.bias"], tensors[f"{i}.1.weight"])
        want = (x + F.silu(x @ w.T + b)) @ lm.T
        torch.testing.assert_close(got[:, i], want)


def test_medusa_layout_drafts_through_create_drafter(model, tmp_path):
    _write_medusa_layout(tmp_path / "m", model, num_heads=3)
    target = loaded(model, "kernels")
    drafter = create_drafter("auto", target, medusa_head=str(tmp_path / "m"))
    assert isinstance(drafter, MedusaDrafter)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=3, adaptive=False), costs=flat())
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    prompt = list(range(3, 15))
    assert decoder.generate_ids(prompt, config)[0] == SpecDecoder(target, None).generate_ids(prompt, config)[0]


def test_bad_medusa_folders_are_refused(model, tmp_path):
    target = loaded(model, "torch")
    _write_medusa_layout(tmp_path / "wide", model, hidden_size=model.config.hidden_size * 2)
    with pytest.raises(IncompatibleDraftError, match="hidden_size"):
        load_medusa_heads(tmp_path / "wide", target)
    _write_medusa_layout(tmp_path / "layers", model, layers=2)
    (tmp_path / "layers" / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(IncompatibleDraftError, match="do not fit"):
        load_medusa_heads(tmp_path / "layers", target)
    (tmp_path / "pickle").mkdir()
    (tmp_path / "pickle" / "medusa_lm_head.pt").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="pickle"):
        load_medusa_heads(tmp_path / "pickle", target)
    with pytest.raises(ModelLoadError, match="no Medusa heads"):
        load_medusa_heads(tmp_path, target)
    with pytest.raises(ConfigError, match="train-drafter --kind medusa"):
        create_drafter("medusa", target)


def test_trained_heads_load_only_onto_their_target(model, tmp_path):
    heads = random_medusa_heads(model)
    heads.save(tmp_path / "h")
    back = load_medusa_heads(tmp_path / "h", loaded(model, "torch"))
    for name, tensor in heads.trainable_state().items():
        torch.testing.assert_close(back.trainable_state()[name], tensor.to(torch.bfloat16).float())
    assert torch.equal(back.draft_ids, heads.draft_ids)
    with pytest.raises(IncompatibleDraftError, match="trained for target"):
        load_medusa_heads(tmp_path / "h", loaded(tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2), "torch"))


@pytest.mark.parametrize("layout", ["specdec", "medusa"])
def test_the_kernel_heads_compute_what_the_torch_heads_do(model, tmp_path, layout):
    from specdec.drafters.heads.medusa_kernels import KernelMedusaHeads, kernel_heads_problem

    if layout == "specdec":
        heads = random_medusa_heads(model)
    else:
        _write_medusa_layout(tmp_path / "m", model, num_heads=3)
        heads = load_medusa_heads(tmp_path / "m", loaded(model, "torch"))
    problem = kernel_heads_problem(heads)
    if problem:
        pytest.skip(f"the CPU kernels cannot run here: {problem}")
    fast = KernelMedusaHeads(heads)
    x = torch.randn(2, model.config.hidden_size)
    torch.testing.assert_close(fast.draft_logits(fast(x)), heads.draft_logits(heads(x)), rtol=1e-4, atol=1e-4)
    target = loaded(model, "kernels")
    decoder = SpecDecoder(target, MedusaDrafter(fast, tree=True, width=2), SpeculationConfig(num_speculative_tokens=4),
                          costs=flat())
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    prompt = list(range(4, 20))
    got, metrics = decoder.generate_ids(prompt, config)
    assert got == SpecDecoder(target, None).generate_ids(prompt, config)[0] and metrics.drafted_tokens > 0


@pytest.mark.parametrize("tree", [False, True])
def test_prompt_lookup_drafts_alone_where_it_is_trusted(model, tree):
    target = loaded(model, "kernels")
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5]  # lookup continuation: 6 7 8 9 ...
    drafter = started(MedusaDrafter(random_medusa_heads(model), tree=tree, width=2), target, prompt)
    first = drafter.propose(prompt, Budget(4, tree=True))  # no estimate of the heads' drafts yet: the heads draft
    assert drafter.branch.head_expected is not None and first.tokens.tolist()[:4] != [6, 7, 8, 9]
    drafter.branch.head_expected = 0.1  # the continuation's prior expectation (0.5 + 0.25 + ...) beats it
    copied = drafter.propose(prompt, Budget(4, tree=True))
    assert copied.parents is None and copied.tokens.tolist() == [6, 7, 8, 9][:len(copied)]
    drafter.branch.head_expected = 5.0
    assert drafter.propose(prompt, Budget(4, tree=True)).tokens.tolist() == first.tokens.tolist()


def test_lookup_only_chains_keep_greedy_output(model, monkeypatch):
    """Heads that are never confident: the chains drafted are prompt-lookup continuations, verified as any chain."""
    from specdec.drafters.trees import LookupBranch

    copied = []
    start = LookupBranch.start
    monkeypatch.setattr(LookupBranch, "start", lambda self, *a: copied.append(start(self, *a)) or copied[-1])
    target = loaded(model, "kernels")
    heads = random_medusa_heads(model)
    heads.draft_lm_head.mul_(1e-3)  # near-uniform guesses
    drafter = MedusaDrafter(heads, tree=False)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=6, adaptive=False), costs=flat())
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9, 10] * 5
    got, metrics = decoder.generate_ids(prompt, config)
    assert got == SpecDecoder(target, None).generate_ids(prompt, config)[0]
    assert any(d is not None for d in copied) and metrics.drafted_tokens > 0  # continuations drafted alone
