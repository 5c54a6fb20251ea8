"""`specdec export-head`: EAGLE and EAGLE-3 heads written as vLLM and SGLang load them, read back through specdec's
loader of the authors' layout: the same drafts, acceptance and text as the head they came from (float32, chains),
the tensor names and config fields those engines' loaders read, and one-line refusals of bad input.

No vLLM or SGLang is installed here: what their loaders need is written below as data, from their code."""
import json

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.heads.eagle3_head import new_eagle3_head
from specdec.drafters.heads.eagle_head import new_head
from specdec.engine import SpecDecoder
from test_cli import run_cli
from tiny import write_tiny_model_folder

LAYERS = (2, 4, 5)  # target layers (inputs) an EAGLE-3 head reads, of the tiny target's 8
PROMPTS = ("the cat sat on the mat", "a big red dog ran to the house", "she was in the tree and he")

# Tensors each engine's loader reads, by name. EAGLE-3: vLLM's Eagle3LlamaForCausalLM.load_weights
# (vllm/model_executor/models/llama_eagle3.py @ 00bd1493b3e8: midlayer.* -> layers.0.*, d2t -> draft_id_to_target_id,
# t2d skipped, embed_tokens loaded then shared when equal to the target's, fc built without bias) and SGLang's
# LlamaForCausalLMEagle3.load_weights (python/sglang/srt/models/llama_eagle3.py @ 03d5a7771f60: d2t -> hot_token_id,
# t2d skipped). EAGLE-1: vLLM's EagleLlamaForCausalLM (llama_eagle.py @ e1c4a55214c6: fc without bias, layer 0
# without input_layernorm, an fc.bias tensor fails the load) and SGLang's LlamaForCausalLMEagle (llama_eagle.py @
# 034b3be819fa: fc with a bias, which stays randomly initialised unless the file holds it).
LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm"]
EAGLE3_TENSORS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight",
                  "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                  *(f"midlayer.{name}.weight" for name in LAYER)}
EAGLE1_TENSORS = {"fc.weight", "embed_tokens.weight", *(f"layers.0.{name}.weight" for name in LAYER)}
TENSORS = {("eagle3", None): EAGLE3_TENSORS, ("eagle", "vllm"): EAGLE1_TENSORS,
           ("eagle", "sglang"): EAGLE1_TENSORS | {"fc.bias"}}
# config.json: the values the engines dispatch and build on (registry names: vLLM's EAGLEConfig keeps a name ending
# in Eagle3 and prefixes "Eagle" to EAGLE-1's, vllm/transformers_utils/configs/eagle.py @ 23c5aa92d517; SGLang's
# EntryClass names), then the fields they read with getattr (bias: attention bias in both engines' llama.py).
ARCHITECTURES = {("eagle3", None): ["LlamaForCausalLMEagle3"], ("eagle", "vllm"): ["LlamaForCausalLM"],
                 ("eagle", "sglang"): ["LlamaForCausalLMEagle"]}
FIXED = {"model_type": "llama", "num_hidden_layers": 1, "hidden_act": "silu", "tie_word_embeddings": False,
         "bias": False}
READ = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
        "vocab_size", "max_position_embeddings", "rope_theta", "rope_scaling")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny target with a tokenizer and 8 layers (EAGLE-3 reads three of them)."""
    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny") / "model", seed=0, hidden=64, layers=8)


@pytest.fixture(scope="module")
def target(folder):
    from specdec.models.loading import load_model

    return load_model(str(folder), dtype="float32", backend="torch")


def perturbed(head, seed: int):
    """The head with every weight moved by noise: not a fresh one, whose parts are zero or the identity."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.15)
    return head


def eagle3_head(target, tmp_path, layers=LAYERS):
    """A specdec EAGLE-3 head (float32) for the target, in a folder of specdec's layout."""
    V = target.info.vocab_size
    torch.manual_seed(0)  # the fresh head's initialisation draws from the global generator
    head = perturbed(new_eagle3_head(target.hf_model, target.name, torch.arange(2, V, 2), layers), seed=1)
    head.save(tmp_path / "mine3", dtype=torch.float32)
    return tmp_path / "mine3"


def eagle_head(target, tmp_path, bias: bool = True, input_norm: bool = False, vocab: int | None = None):
    """A specdec EAGLE-1 head (float32) over the whole vocabulary (or its first `vocab` tokens), without the input
    norm the engines lack, its fc bias zero unless `bias`."""
    torch.manual_seed(0)  # the fresh head's initialisation draws from the global generator
    head = perturbed(new_head(target.hf_model, target.name, torch.arange(vocab or target.info.vocab_size),
                              input_norm=input_norm), seed=10)  # a seed whose drafts are sometimes accepted
    if not bias:
        with torch.no_grad():
            head.fc.bias.zero_()
    head.save(tmp_path / "mine", dtype=torch.float32)
    return tmp_path / "mine"


def export(capsys, folder, head, out, *options):
    return run_cli(capsys, "export-head", "--model", str(folder), "--head", str(head), "--out", str(out), *options)


def drafts_and_text(target, head_folder, drafter: str):
    """Every chain the head drafted (4 tokens a step, no adaptation), each request's drafted and accepted counts
    per position, and the texts, over PROMPTS (greedy, 20 tokens each)."""
    made = create_drafter(drafter, target, eagle_head=head_folder, tree=False)
    chains, propose = [], made.propose

    def recorded(context, k):
        draft = propose(context, k)
        chains.append(draft.tokens.tolist())
        return draft

    made.propose = recorded
    decoder = SpecDecoder(target, made, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    runs = [decoder.generate(p, GenerationConfig(max_new_tokens=20, ignore_eos=True)) for p in PROMPTS]
    counts = [(r.metrics.drafted_per_position, r.metrics.accepted_per_position) for r in runs]
    return chains, counts, [r.text for r in runs]


@pytest.mark.parametrize("drafter, engine, bias", [("eagle3", None, False), ("eagle", "sglang", True),
                                                   ("eagle", "vllm", False)])
def test_an_exported_head_drafts_as_the_original(capsys, folder, target, tmp_path, drafter, engine, bias):
    mine = (eagle3_head(target, tmp_path) if drafter == "eagle3" else eagle_head(target, tmp_path, bias=bias))
    rc, out, err = export(capsys, folder, mine, tmp_path / "out", "--drafter", drafter, "--dtype", "float32",
                          *(("--engine", engine) if engine else ()))
    assert rc == 0, err
    assert out.startswith(f"wrote {tmp_path / 'out'}: ") and "serve with" in out
    assert "specdec" not in json.loads((tmp_path / "out" / "config.json").read_text())  # read as the authors' files
    chains, counts, texts = drafts_and_text(target, mine, drafter)
    assert drafts_and_text(target, tmp_path / "out", drafter) == (chains, counts, texts)
    assert sum(len(c) for c in chains) > 0 and sum(sum(a) for _, a in counts) > 0  # drafted, and some accepted
    plain = SpecDecoder(target, None)
    assert texts == [plain.generate(p, GenerationConfig(max_new_tokens=20, ignore_eos=True)).text for p in PROMPTS]


@pytest.mark.parametrize("drafter, engine", [("eagle3", None), ("eagle", "vllm"), ("eagle", "sglang")])
def test_the_files_hold_what_the_engines_read(capsys, folder, target, tmp_path, drafter, engine):
    from safetensors.torch import load_file

    from specdec.drafters.heads.eagle_published import rope_frequencies

    mine = eagle3_head(target, tmp_path) if drafter == "eagle3" else eagle_head(target, tmp_path, bias=False)
    rc, _, err = export(capsys, folder, mine, tmp_path / "out", "--drafter", drafter,
                        *(("--engine", engine) if engine else ()))
    assert rc == 0, err
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert set(tensors) == TENSORS[drafter, engine]
    assert config["architectures"] == ARCHITECTURES[drafter, engine]
    assert {k: config[k] for k in FIXED} == FIXED and all(k in config for k in READ)
    cfg, H, V = target.hf_model.config, 64, target.info.vocab_size
    assert (config["hidden_size"], config["vocab_size"], config["head_dim"]) == (H, V, 16)
    assert config["max_position_embeddings"] == cfg.max_position_embeddings
    assert torch.equal(rope_frequencies(config, 16, tmp_path), target.hf_model.model.rotary_emb.inv_freq)
    assert torch.equal(tensors["embed_tokens.weight"], target.hf_model.get_input_embeddings().weight.bfloat16())
    assert {v.dtype for k, v in tensors.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
    if drafter == "eagle3":
        K = V // 2 - 1  # tokens 2, 4, ... V - 2
        assert config["draft_vocab_size"] == K and config["target_hidden_size"] == H
        assert tensors["fc.weight"].shape == (H, 3 * H) and tensors["lm_head.weight"].shape == (K, H)
        assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * H)
        assert tensors["d2t"].dtype == torch.int64 and torch.equal(tensors["d2t"] + torch.arange(K),
                                                                   torch.arange(2, V, 2))
        assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == K
        assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)  # vLLM: the layers whose inputs are read
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang: outputs before them
    else:
        assert tensors["fc.weight"].shape == (H, 2 * H) and "draft_vocab_size" not in config
    from transformers import AutoConfig  # what both engines parse config.json with first

    parsed = AutoConfig.from_pretrained(tmp_path / "out")
    assert type(parsed).__name__ == "LlamaConfig" and parsed.num_hidden_layers == 1
    assert parsed.rope_parameters["rope_theta"] == config["rope_theta"] and not parsed.tie_word_embeddings


def test_rope_fields_reproduce_the_targets_frequencies():
    """Unscaled, linear and Llama 3 RoPE: the fields written give, through the published-head loader, the target's
    own inverse frequencies."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from specdec.drafters.heads.eagle_published import rope_frequencies
    from specdec.drafters.heads.head_export import rope_fields

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    for scaling in (None, {"rope_type": "linear", "factor": 4.0}, llama3):
        cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=500000.0, rope_scaling=scaling,
                          max_position_embeddings=131072)
        data = {**rope_fields(cfg), "num_attention_heads": 4, "max_position_embeddings": 131072}
        assert data["rope_theta"] == 500000.0
        assert torch.allclose(rope_frequencies(data, 64, None), LlamaRotaryEmbedding(cfg).inv_freq, rtol=1e-6)


def one_line_error(rc, out, err, *words):
    assert rc == 2 and not out and err.startswith("specdec export-head: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err


def test_bad_input_is_refused_in_one_line(capsys, folder, target, tmp_path):
    mine3, out = eagle3_head(target, tmp_path), tmp_path / "out"
    (tmp_path / "empty").mkdir()
    one_line_error(*export(capsys, folder, tmp_path / "empty", out, "--drafter", "eagle", "--engine", "vllm"),
                   "holds no EAGLE head")
    one_line_error(*export(capsys, folder, tmp_path / "nowhere", out), "is not a folder")
    one_line_error(*export(capsys, folder, mine3, out, "--drafter", "eagle", "--engine", "vllm"),
                   "holds an EAGLE-3 head", "--drafter eagle3")
    one_line_error(*export(capsys, folder, eagle_head(target, tmp_path), out), "holds no EAGLE-3 head")
    (tmp_path / "file").write_text("x")
    one_line_error(*export(capsys, folder, mine3, tmp_path / "file"), "is a file")
    one_line_error(*export(capsys, folder, mine3, tmp_path), "is not empty")
    one_line_error(*export(capsys, folder, mine3, mine3), "the head's own folder")
    one_line_error(*run_cli(capsys, "export-head", "--model", str(folder), "--drafter", "medusa", "--out", str(out)),
                   "invalid choice")
    assert not out.exists()  # nothing written by a refusal


def test_heads_the_engines_cannot_run_are_refused(capsys, folder, target, tmp_path):
    out = tmp_path / "out"
    one_line_error(*export(capsys, folder, eagle_head(target, tmp_path, bias=True), out, "--drafter", "eagle"),
                   "--engine vllm or --engine sglang")
    one_line_error(*export(capsys, folder, tmp_path / "mine", out, "--drafter", "eagle", "--engine", "vllm"),
                   "no fc bias", "--engine sglang")
    one_line_error(*export(capsys, folder, eagle_head(target, tmp_path, input_norm=True), out, "--drafter",
                           "eagle", "--engine", "sglang"), "norm before attention")
    one_line_error(*export(capsys, folder, eagle3_head(target, tmp_path, layers=(0, 4, 5)), out), "layers [0, 4, 5]")
    assert not out.exists()


def test_a_smaller_draft_vocabulary_is_noted_for_eagle1(capsys, folder, target, tmp_path):
    rc, out, err = export(capsys, folder, eagle_head(target, tmp_path, vocab=20), tmp_path / "out", "--drafter",
                          "eagle", "--engine", "sglang")
    assert rc == 0, err
    assert "note: sglang drafts EAGLE-1/2 heads over the whole vocabulary" in out and "of 20 does not" in out


@pytest.mark.slow
def test_a_head_for_the_real_model(capsys, tmp_path):
    """smollm2-135m (when cached): a fresh EAGLE-3 head (bfloat16, as specdec saves trained heads) exported in
    bfloat16 drafts as the original; the shipped EAGLE head, in the authors' layout, exports for either engine with
    its own weights (the engines draft it over the whole vocabulary, which is noted)."""
    from specdec.models.loading import load_model
    from specdec.models.registry import is_cached

    if not is_cached("smollm2-135m"):
        pytest.skip("smollm2-135m is not cached")
    target = load_model("smollm2-135m", dtype="float32", backend="torch")
    torch.manual_seed(0)
    head = new_eagle3_head(target.hf_model, target.name, torch.arange(0, 49152, 6))
    head.save(tmp_path / "mine", dtype=torch.bfloat16)
    rc, out, err = run_cli(capsys, "export-head", "--head", str(tmp_path / "mine"), "--out", str(tmp_path / "out"))
    assert rc == 0, err
    assert "draft vocabulary 8192 of 49152, target layers 2, 15, 27; bfloat16) for vllm and sglang" in out
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["rope_theta"], config["hidden_size"], config["num_key_value_heads"]) == (100000.0, 576, 3)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    first = drafts_and_text(target, tmp_path / "mine", "eagle3")
    assert drafts_and_text(target, tmp_path / "out", "eagle3") == first
    from specdec.drafters.heads.eagle_loading import load_head
    from specdec.drafters.routing.auto import bundled_head

    shipped = load_head(bundled_head("smollm2-135m"), target).state_dict()
    for engine in ("vllm", "sglang"):
        rc, out, err = run_cli(capsys, "export-head", "--drafter", "eagle", "--engine", engine, "--out",
                               str(tmp_path / engine))
        assert rc == 0, err
        assert "draft vocabulary of 8192 does not carry over" in out
        exported = load_head(tmp_path / engine, target).state_dict()  # read as the authors' files
        assert exported.keys() == shipped.keys()
        assert all(torch.equal(exported[k], shipped[k]) for k in shipped)
