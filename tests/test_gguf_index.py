"""A quantized GGUF file's second load reads what its first one made of the metadata (models/gguf_index.py) and is
the same model: the same config, the same tokenizer, the same tensors, so the same logits; a changed file, a
damaged entry or a cache that cannot be written fall back to parsing the file."""
import os

import pytest
import torch

from families import _COMMON, PROMPTS, bpe_tokenizer, prompt_ids
from gguf_writer import write_gguf
from specdec.models import gguf_index
from specdec.models.loading import load_model

kernels = pytest.importorskip("specdec.kernels")
if kernels.unavailable_reason():
    pytest.skip(kernels.unavailable_reason(), allow_module_level=True)

QUANT = {"ffn_down": "Q4_0", "": "Q8_0"}


def _file(path, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**_COMMON, "hidden_size": 128, "intermediate_size": 256, "eos_token_id": 2})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return write_gguf(model, bpe_tokenizer(), path, quant=QUANT)


def _parses(monkeypatch) -> list:
    """Counts the gguf package's readers made from here on (each parses a file's metadata)."""
    import gguf

    made, real = [], gguf.GGUFReader

    def counting(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    return made


def _logits(loaded) -> torch.Tensor:
    backend = loaded.backend
    cache = backend.new_cache()
    try:
        return backend.forward(cache, torch.tensor(prompt_ids()[0])).logits
    finally:
        backend.release(cache)


def _same_model(a, b) -> None:
    assert torch.equal(_logits(a), _logits(b))
    assert a.backend.weight_types == b.backend.weight_types
    assert a.hf_model.config.to_dict() == b.hf_model.config.to_dict()
    for text in [*PROMPTS, "  spaces\n\tand ünïcode 🙂</s>"]:
        assert a.tokenizer(text)["input_ids"] == b.tokenizer(text)["input_ids"]
    ids = a.tokenizer(PROMPTS[0])["input_ids"]
    assert a.tokenizer.decode(ids) == b.tokenizer.decode(ids)
    assert (a.tokenizer.eos_token_id, a.tokenizer.bos_token_id) == (b.tokenizer.eos_token_id, b.tokenizer.bos_token_id)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The entries' folder, in the test's own folder (the kernels' builds stay in specdec's cache)."""
    monkeypatch.setattr(gguf_index, "index_root", lambda: tmp_path / "gguf-index")
    return tmp_path / "gguf-index"


def test_a_second_load_of_the_file_parses_nothing_and_is_the_same_model(tmp_path, cache, monkeypatch):
    path = _file(tmp_path / "m.gguf")
    parses = _parses(monkeypatch)
    first = load_model(str(path), device="cpu")
    assert len(parses) >= 1 and len(list(cache.iterdir())) == 1
    parses.clear()
    second = load_model(str(path), device="cpu")
    assert parses == []
    _same_model(first, second)


def test_a_changed_file_is_parsed_again(tmp_path, cache, monkeypatch):
    path = _file(tmp_path / "m.gguf", seed=0)
    first = load_model(str(path), device="cpu")
    _file(path, seed=1)  # the same size, other weights
    parses = _parses(monkeypatch)
    changed = load_model(str(path), device="cpu")
    assert parses
    assert not torch.equal(_logits(first), _logits(changed))
    parses.clear()
    _same_model(changed, load_model(str(path), device="cpu"))
    assert parses == []


@pytest.mark.parametrize("damage", ["index.json", "tokenizer.json", "config.json", "offsets"])
def test_a_damaged_entry_is_parsed_again_and_replaced(tmp_path, cache, monkeypatch, damage):
    path = _file(tmp_path / "m.gguf")
    first = load_model(str(path), device="cpu")
    (entry,) = cache.iterdir()
    if damage == "offsets":  # an index whose tensors lie past the end of the file
        text = (entry / "index.json").read_text()
        (entry / "index.json").write_text(text.replace('"offset": ', '"offset": 1000000000'))
    else:
        (entry / damage).write_text((entry / damage).read_text()[:40])
    parses = _parses(monkeypatch)
    again = load_model(str(path), device="cpu")
    assert parses
    _same_model(first, again)
    parses.clear()
    load_model(str(path), device="cpu")
    assert parses == []


def test_metadata_rewritten_in_place_with_the_same_size_and_times_is_parsed_again(tmp_path, cache, monkeypatch):
    """A file whose metadata changed under the same path, size, inode and modification time (a rewrite within the
    clock's resolution) misses: its bytes before the first tensor are the entry's digest."""
    path = _file(tmp_path / "m.gguf")
    load_model(str(path), device="cpu")
    stat = os.stat(path)
    data = bytearray(path.read_bytes())
    at = data.index(b"general.architecture")
    data[at : at + 7] = b"GENERAL"  # a metadata key renamed, nothing else moved
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert gguf_index.load_cached(path) is None


def test_a_cache_that_cannot_be_written_leaves_loads_working(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the entries' folder would be")
    monkeypatch.setattr(gguf_index, "index_root", lambda: blocked / "gguf-index")
    path = _file(tmp_path / "m.gguf")
    parses = _parses(monkeypatch)
    load_model(str(path), device="cpu")
    load_model(str(path), device="cpu")
    assert len(parses) >= 2


def test_only_the_most_recently_used_entries_are_kept(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(gguf_index, "KEEP", 2)
    paths = [_file(tmp_path / f"m{i}.gguf", seed=i) for i in range(3)]
    for path in paths:
        load_model(str(path), device="cpu")
    assert len(list(cache.iterdir())) == 2
    parses = _parses(monkeypatch)
    load_model(str(paths[-1]), device="cpu")  # the newest is kept
    assert parses == []


def test_a_tokenizer_that_does_not_read_back_the_same_is_not_cached(tmp_path, cache, monkeypatch):
    """An entry is written only where the config and tokenizer read back from it encode, decode and template as
    those the file made: here the read-back tokenizer has one more token, which changes an encoding."""
    read_back = gguf_index._from_folder

    def drifted(folder, path):
        config, tokenizer = read_back(folder, path)
        tokenizer.add_tokens(["Hello"])
        return config, tokenizer

    monkeypatch.setattr(gguf_index, "_from_folder", drifted)
    path = _file(tmp_path / "m.gguf")
    load_model(str(path), device="cpu")
    assert not cache.exists() or not any((p / "index.json").exists() for p in cache.iterdir())
    parses = _parses(monkeypatch)
    load_model(str(path), device="cpu")
    assert parses


def test_a_file_the_kernels_do_not_run_is_not_kept(tmp_path, cache, monkeypatch):
    """A file loaded dequantized (here: its architecture said to be one the kernels do not map) leaves no entry:
    transformers parses it for the dequantized load anyway."""
    from specdec.models import gguf_model

    monkeypatch.setattr(gguf_model, "architecture_problem", lambda config: "an architecture the test rules out")
    path = _file(tmp_path / "m.gguf")
    loaded = load_model(str(path), device="cpu")
    assert not loaded.backend.quantized_weights  # dequantized: the float model of the file
    assert not cache.exists() or not any(cache.iterdir())
