"""A load parses a GGUF file's metadata once, through the gguf package's reader over a plain view of its mapping
(specdec/models/gguf_parsing.py): the same fields and tensors as the reader gives alone, and the package as it was
after the block, whatever happened inside it."""
import gguf
import numpy as np
import pytest
from gguf import gguf_reader

from families import bpe_tokenizer
from gguf_writer import write_gguf
from specdec.models.gguf_parsing import fast_gguf_parsing
from test_gguf_quantized_model import MIX, _model


@pytest.fixture(scope="module")
def quantized_file(tmp_path_factory):
    return write_gguf(_model("llama"), bpe_tokenizer(), tmp_path_factory.mktemp("gguf") / "llama.gguf", quant=MIX)


def test_the_reader_reads_what_it_reads_alone(quantized_file):
    alone = gguf.GGUFReader(str(quantized_file))
    with fast_gguf_parsing():
        fast = gguf.GGUFReader(str(quantized_file))
        assert gguf.GGUFReader(str(quantized_file)) is fast  # one reader a file in the block
    assert type(fast.data) is np.ndarray and type(alone.data) is np.memmap
    assert list(fast.fields) == list(alone.fields)
    for name, field in alone.fields.items():
        assert field.types == fast.fields[name].types and field.data == fast.fields[name].data
        assert all(np.array_equal(a, b) for a, b in zip(field.parts, fast.fields[name].parts))
    assert [t.name for t in fast.tensors] == [t.name for t in alone.tensors]
    for mine, theirs in zip(fast.tensors, alone.tensors):  # read after the block: the mapping stays alive
        assert mine.tensor_type == theirs.tensor_type and np.array_equal(mine.data, theirs.data)


def test_the_package_is_as_it_was_after_the_block_even_after_an_error(quantized_file):
    numpy_before, reader_before = gguf_reader.np, gguf.GGUFReader
    with pytest.raises(RuntimeError):
        with fast_gguf_parsing():
            with fast_gguf_parsing():  # nested blocks share nothing they should not
                assert gguf.GGUFReader is not reader_before
            raise RuntimeError("inside")
    assert gguf_reader.np is numpy_before is np and gguf.GGUFReader is reader_before
    assert type(gguf.GGUFReader(str(quantized_file)).data) is np.memmap


def test_a_load_parses_the_file_once(quantized_file, monkeypatch, tmp_path):
    """specdec's reader for the tensors, transformers' config and its tokenizer: one parse for the three (a first
    load: no earlier load's metadata in the cache; a later one parses nothing, test_gguf_index)."""
    from specdec.models import gguf_index
    from specdec.models.loading import load_model

    monkeypatch.setattr(gguf_index, "index_root", lambda: tmp_path / "gguf-index")

    parses = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            parses.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    target = load_model(str(quantized_file), device="cpu")
    assert type(target.backend).__name__ == "KernelLlama" and target.backend.weight_types
    assert parses == [str(quantized_file)]


def test_a_load_frees_the_parsed_metadata_before_it_builds_the_model(quantized_file, monkeypatch, tmp_path):
    """Once the config and tokenizer exist, the reader's metadata fields (a vocabulary's hundreds of thousands of
    small arrays) are freed, before the model's long-lived objects are made (gguf_model.drop_parsed_metadata), so
    that the heap's arenas they filled are handed back whole; the tensors stay readable. (A load that parses: no
    earlier load's metadata in the cache, gguf_index.)"""
    from specdec.models import gguf_index, gguf_model
    from specdec.models.loading import load_model

    monkeypatch.setattr(gguf_index, "index_root", lambda: tmp_path / "gguf-index")

    readers, fields_when_built = [], []

    class KeptReader(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            super().__init__(path, mode)
            readers.append(self)

    build = gguf_model.skeleton

    def watched_skeleton(config):
        fields_when_built.append(len(readers[0].fields))
        return build(config)

    monkeypatch.setattr(gguf, "GGUFReader", KeptReader)
    monkeypatch.setattr(gguf_model, "skeleton", watched_skeleton)
    target = load_model(str(quantized_file), device="cpu")
    assert fields_when_built == [0] and not readers[0].fields and readers[0].tensors
    ids = target.tokenizer("a test", return_tensors="pt").input_ids[0].tolist()
    assert target.backend.weight_types and len(ids) > 0
