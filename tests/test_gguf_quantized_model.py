"""A quantized GGUF file runs in its own formats on the CPU kernels, and speculation over it is lossless.

Tiny random Llama and Qwen3 models are written as GGUF files with quantized matrices (the gguf package quantizes
them, llama.cpp's names, Llama's q and k rows permuted as llama.cpp's converter does); load_model keeps those
matrices quantized. Its logits approximate transformers' on the dequantized file (the activations are rounded to
int8), every pass is batch-invariant, and so every drafter's greedy output, and a seeded sampled output under the
coupled verifier, equal plain decoding of the same file."""
import subprocess
import sys

import pytest
import torch

from families import _COMMON, bpe_tokenizer, prompt_ids
from gguf_writer import write_gguf
from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from specdec.errors import ModelLoadError
from specdec.models.loading import load_model

kernels = pytest.importorskip("specdec.kernels")
if kernels.unavailable_reason():
    pytest.skip(kernels.unavailable_reason(), allow_module_level=True)

MIX = {"attn_v": "Q8_0", "ffn_down": "Q4_0", "token_embd": "Q8_0", "": "Q4_1"}  # "" : every other matrix


def _model(arch: str, seed: int = 0, **extra):
    import transformers

    config_class = {"llama": "LlamaConfig", "qwen3": "Qwen3Config"}[arch]  # head_dim 128: what transformers
    # reads back for Qwen3 from a GGUF file (its key mapping lacks head_dim)
    settings = {**_COMMON, "hidden_size": 128, "intermediate_size": 256, "bos_token_id": 1, "eos_token_id": 2,
                **({"head_dim": 128} if arch == "qwen3" else {}), **extra}
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**settings)).eval()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def quantized_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    return write_gguf(_model(request.param), bpe_tokenizer(), path, quant=MIX)


@pytest.fixture(scope="module")
def target(quantized_file):
    return load_model(str(quantized_file), device="cpu")


def test_the_files_matrices_stay_in_their_formats(target):
    assert type(target.backend).__name__ == "KernelLlama"
    assert target.backend.weight_types == ["Q4_0", "Q4_1", "Q8_0"]


def test_logits_approximate_transformers_on_the_dequantized_file(target, quantized_file):
    """The same weights (Llama's q/k permutation undone as transformers undoes it): only the int8 activations
    separate the two, so the logits agree closely, and far more closely than another model's."""
    reference = load_model(str(quantized_file), device="cpu", dtype="float32", backend="hf", dequantize=True)
    other = _model(reference.info.model_type, seed=1)
    ids = torch.tensor(prompt_ids()[0])
    ours = target.backend.forward(target.backend.new_cache(), ids).logits
    with torch.no_grad():
        theirs = reference.hf_model(ids[None]).logits[0]
        unrelated = other(ids[None]).logits[0]
    error = (ours - theirs).norm() / theirs.norm()
    assert error < 0.1, error
    assert (unrelated - theirs).norm() / theirs.norm() > 10 * error


def test_the_kv_cache_is_bfloat16_unless_the_kernels_backend_is_named(target, quantized_file):
    """auto keeps keys and values in 16 bits as llama.cpp does; --backend kernels keeps them in float32, and the
    two caches give different logits (the choice is real), no further apart than the int8 activations put either
    from transformers' float32 (test_logits_approximate_transformers_on_the_dequantized_file)."""
    assert target.backend.pool.keys.dtype == torch.bfloat16
    wide = load_model(str(quantized_file), device="cpu", backend="kernels")
    assert wide.backend.pool.keys.dtype == torch.float32
    ids = torch.tensor(prompt_ids()[0])
    ours = target.backend.forward(target.backend.new_cache(), ids).logits
    theirs = wide.backend.forward(wide.backend.new_cache(), ids).logits
    assert not torch.equal(ours, theirs)
    assert (ours - theirs).norm() / theirs.norm() < 0.1


@pytest.mark.parametrize("backend", ["auto", "kernels"])
def test_a_pass_over_several_tokens_gives_each_token_what_a_pass_over_it_alone_gives(target, quantized_file,
                                                                                       backend):
    model = target if backend == "auto" else load_model(str(quantized_file), device="cpu", backend=backend)
    ids = torch.tensor(prompt_ids()[1])
    whole = model.backend.forward(model.backend.new_cache(), ids).logits
    cache = model.backend.new_cache()
    model.backend.forward(cache, ids[:3])
    steps = [model.backend.forward(cache, ids[i:i + 1]).logits[0] for i in range(3, len(ids))]
    assert torch.equal(torch.stack(steps), whole[3:])


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "recycle", "layerskip", "draft-model", "eagle"])
def test_greedy_speculation_over_a_quantized_target_is_plain_decoding(target, quantized_file, drafter, tmp_path):
    options = {"draft_model": load_model(str(quantized_file), device="cpu")} if drafter == "draft-model" else {}
    if drafter == "eagle":  # a random head, whose products run in the file's 8-bit arithmetic (head_bits)
        from specdec.drafters.heads.eagle_head import new_head
        from specdec.models.gguf_model import attach_float_tables

        target = load_model(str(quantized_file), device="cpu")  # its own: the float tables stay off the shared one
        attach_float_tables(target)
        new_head(target.hf_model, "tiny", torch.arange(target.info.vocab_size)).save(tmp_path / "head")
        options = {"eagle_head": tmp_path / "head", "tree": False}
    spec = SpeculationConfig(num_speculative_tokens=4, adaptive=False)
    plain = SpecDecoder(target, None)
    built = create_drafter(drafter, target, **options)
    assert drafter != "eagle" or built.head.bits == 8
    speculative = SpecDecoder(target, built, spec)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    drafted = 0
    for prompt in prompt_ids()[:3]:
        repeated = prompt * 3  # text to look up, for the lookup drafters
        got, stats = speculative.generate_ids(repeated, config)
        assert got == plain.generate_ids(repeated, config)[0]
        drafted += stats.drafted_tokens
    assert drafted > 0


@pytest.mark.parametrize("drafter", ["ngram", "recycle"])
def test_seeded_sampling_over_a_quantized_target_is_the_same_with_and_without_speculation(target, drafter):
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True, sampling=SamplingConfig(temperature=0.9, seed=11))
    spec = SpeculationConfig(num_speculative_tokens=4, adaptive=False, sampling_verifier="coupled")
    plain = SpecDecoder(target, None, spec)
    speculative = SpecDecoder(target, create_drafter(drafter, target), spec)
    for prompt in prompt_ids()[:3]:
        assert speculative.generate_ids(prompt * 2, config)[0] == plain.generate_ids(prompt * 2, config)[0]


def test_drafters_that_need_float_weights_say_so(target):
    from specdec.errors import ConfigError

    with pytest.raises(ConfigError, match="--dequantize"):
        create_drafter("quantized", target)


def test_a_type_the_kernels_do_not_read_is_dequantized_with_one_line(tmp_path, capfd):
    path = write_gguf(_model("qwen3"), bpe_tokenizer(), tmp_path / "q5.gguf", quant={"ffn_up": "Q5_0", "": "Q8_0"})
    model = load_model(str(path), device="cpu")
    assert model.backend.weight_types == ["Q8_0"]
    assert "Q5_0 matrices are dequantized to float32" in capfd.readouterr().err


def test_k_quant_files_run_in_their_formats_and_speculation_over_them_is_lossless(tmp_path):
    """Q4_K, Q5_K and Q6_K matrices (a model whose inner sizes are multiples of 256, as K-quants need): kept in their
    formats, close to transformers' logits on the dequantized file, batch-invariant, and greedy speculation over
    them is plain decoding."""
    mix = {"ffn_down": "Q6_K", "attn_v": "Q4_K", "ffn_gate": "Q4_K", "": "Q5_K"}
    path = write_gguf(_model("llama", hidden_size=256, intermediate_size=512), bpe_tokenizer(), tmp_path / "k.gguf",
                      quant=mix)
    target = load_model(str(path), device="cpu")
    assert target.backend.weight_types == ["Q4_K", "Q5_K", "Q6_K"]
    reference = load_model(str(path), device="cpu", dtype="float32", backend="hf", dequantize=True)
    ids = torch.tensor(prompt_ids()[0])
    ours = target.backend.forward(target.backend.new_cache(), ids).logits
    with torch.no_grad():
        theirs = reference.hf_model(ids[None]).logits[0]
    assert (ours - theirs).norm() / theirs.norm() < 0.1
    cache = target.backend.new_cache()
    target.backend.forward(cache, ids[:3])
    steps = [target.backend.forward(cache, ids[i:i + 1]).logits[0] for i in range(3, len(ids))]
    assert torch.equal(torch.stack(steps), ours[3:])
    spec = SpeculationConfig(num_speculative_tokens=4, adaptive=False)
    plain, speculative = SpecDecoder(target, None), SpecDecoder(target, create_drafter("ngram", target), spec)
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    for prompt in prompt_ids()[:2]:
        assert speculative.generate_ids(prompt * 3, config)[0] == plain.generate_ids(prompt * 3, config)[0]


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_file_is_one_clear_line(tmp_path, quantized_file, damage):
    data = quantized_file.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"GGUF" + bytes(range(256)) * 40)
    with pytest.raises(ModelLoadError):
        load_model(str(bad), device="cpu")
    run = subprocess.run([sys.executable, "-m", "specdec.cli.main", "generate", "hi", "--model", str(bad),
                          "--max-new-tokens", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr


def test_heads_built_on_the_target_get_the_files_embeddings_and_head(target, quantized_file):
    """EAGLE and Medusa heads read the target's embeddings and LM head as floats: for a quantized file, exactly
    the values transformers dequantizes the file to, widened from the kernels' bytes on first use."""
    from specdec.models.gguf_model import attach_float_tables

    reference = load_model(str(quantized_file), device="cpu", dtype="float32", backend="hf", dequantize=True)
    assert target.hf_model.get_input_embeddings().weight.device.type == "meta"
    attach_float_tables(target)
    for get in ("get_input_embeddings", "get_output_embeddings"):
        assert torch.equal(getattr(target.hf_model, get)().weight, getattr(reference.hf_model, get)().weight)


def test_a_dtype_asked_of_a_quantized_file_is_said_to_apply_with_dequantize(quantized_file, capsys):
    load_model(str(quantized_file), device="cpu")
    assert "--dtype" not in capsys.readouterr().err
    loaded = load_model(str(quantized_file), device="cpu", dtype="bfloat16")
    assert loaded.backend.quantized_weights
    assert capsys.readouterr().err.strip().splitlines() == [
        f"specdec: {quantized_file} runs its file's quantized matrices; --dtype applies with --dequantize"]
