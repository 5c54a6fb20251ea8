"""Faults on purpose: a damaged model cache, damaged head files, a conversion, checkpoint or data write killed
half-way, a full disk under traces and checkpoints. Each ends in a clear error or a recovery, never a traceback
or garbage loaded as if it were good."""
import errno
import json
import os
from types import SimpleNamespace

import pytest
import torch

from specdec.errors import IncompatibleDraftError, ModelLoadError
from tiny import loaded, tiny_llama, write_tiny_model_folder


@pytest.fixture
def fake_fetch(tmp_path, monkeypatch):
    """SPECDEC_CACHE in tmp_path, and a built-in alias whose 'download and conversion' writes a tiny model (no
    network); .calls counts conversions."""
    from specdec.models import fetch

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(alias, work, out, quiet):
        calls.append(alias)
        write_tiny_model_folder(out, seed=0)

    monkeypatch.setattr(fetch, "fetch_and_convert", convert)
    return SimpleNamespace(calls=calls, ensure=lambda: fetch.ensure_known_model("smollm2-135m", quiet=True))


def test_a_damaged_model_cache_is_converted_again(fake_fetch):
    folder = fake_fetch.ensure()
    assert fake_fetch.calls == ["smollm2-135m"] and fake_fetch.ensure() == folder  # cached: no second conversion
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])  # cut short, as a full disk or a killed copy leaves it
    assert fake_fetch.ensure() == folder and len(fake_fetch.calls) == 2
    assert weights.read_bytes() == good
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF  # same size, other bytes
    weights.write_bytes(bytes(flipped))
    fake_fetch.ensure()
    assert len(fake_fetch.calls) == 3 and weights.read_bytes() == good
    (folder / "specdec-manifest.json").unlink()  # a cache without its manifest is not trusted
    fake_fetch.ensure()
    assert len(fake_fetch.calls) == 4


def test_a_conversion_killed_half_way_is_never_loaded_and_is_redone(fake_fetch, tmp_path):
    from specdec.models import fetch

    models = tmp_path / "cache" / "models"
    stale = models / ".smollm2-135m-killed" / "converted"  # what kill -9 during a conversion leaves
    write_tiny_model_folder(stale, seed=0)
    (stale / "model.safetensors").write_bytes(b"half")

    def dying(alias, work, out, quiet):
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt  # killed during the conversion

    original = fetch.fetch_and_convert
    fetch.fetch_and_convert = dying
    try:
        with pytest.raises(KeyboardInterrupt):
            fake_fetch.ensure()
    finally:
        fetch.fetch_and_convert = original
    assert not (models / "smollm2-135m").exists()  # the target folder appears whole or not at all
    folder = fake_fetch.ensure()
    assert fake_fetch.calls == ["smollm2-135m"] and not list(models.glob(".smollm2-135m-*"))
    assert fetch.verify_folder(folder) is None


def test_a_damaged_local_model_is_a_clear_error(tmp_path):
    from specdec.models.loading import load_model

    folder = write_tiny_model_folder(tmp_path / "m", seed=0)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_model(str(folder), dtype="float32")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "config", "shape"])
def test_a_damaged_head_is_refused_in_one_line(tmp_path, damage):
    from specdec.drafters import create_drafter
    from specdec.drafters.heads.eagle_head import new_head

    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    target = loaded(model, "torch")
    folder = tmp_path / "head"
    new_head(model, "tiny", torch.arange(64)).save(folder)
    weights, config = folder / "eagle_head.safetensors", folder / "eagle_config.json"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:300])
    elif damage == "garbage":
        weights.write_bytes(os.urandom(4096))
    elif damage == "config":
        config.write_text(config.read_text()[:40])
    else:  # the config promises another layer size than the tensors hold
        data = json.loads(config.read_text())
        data["intermediate_size"] *= 2
        config.write_text(json.dumps(data))
    with pytest.raises(IncompatibleDraftError) as caught:
        create_drafter("eagle", target, eagle_head=folder)
    assert str(folder) in str(caught.value) and "\n" not in str(caught.value)


def test_a_training_checkpoint_killed_half_way_leaves_the_last_good_one(tmp_path, monkeypatch):
    from specdec.drafters.heads.eagle_head import new_head
    from specdec.training import trainer as trainer_module
    from specdec.training.batching import TrainSettings
    from specdec.training.trainer import CHECKPOINT, Trainer

    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    gen = torch.Generator().manual_seed(0)
    seqs = [{"tokens": torch.randint(0, 64, (20,), generator=gen), "features": torch.randn(19, 64, generator=gen),
             "labels": torch.randint(0, 64, (19,), generator=gen), "trainable": torch.ones(19, dtype=torch.bool),
             "source": "s"} for _ in range(12)]
    settings = TrainSettings(steps=2, warmup=1, batch_tokens=64, max_len=20)
    first = Trainer(new_head(model, "tiny", torch.arange(64)), seqs, tmp_path, settings, 1e9, max_steps=6)
    first.run(progress=False, stop_after=3)
    first.checkpoint({})
    good = (tmp_path / CHECKPOINT).read_bytes()
    real_save = trainer_module.save_file

    def killed(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(100)  # the kill struck mid-write
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "save_file", killed)
    first.run(progress=False, stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        first.checkpoint({})
    assert (tmp_path / CHECKPOINT).read_bytes() == good and not list(tmp_path.glob(".*tmp*"))
    monkeypatch.setattr(trainer_module, "save_file", real_save)
    resumed = Trainer(new_head(model, "tiny", torch.arange(64)), seqs, tmp_path, settings, 1e9, max_steps=6)
    resumed.resume()
    assert resumed.step == 3


def test_a_full_disk_under_the_trace_drops_records_not_requests(tmp_path, monkeypatch):
    from specdec.trace import TraceWriter, read_trace

    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, "tiny", {1: 0.01, 2: 0.02})
    state = SimpleNamespace(
        config=SimpleNamespace(sampling=SimpleNamespace(greedy=True), constraint=None, max_new_tokens=4),
        metrics=SimpleNamespace(finish_reason="length", prefill_time_s=0.0, draft_time_s=0.0, verify_time_s=0.0,
                                acceptance="exact"),
        drafter=None, k_max=4, adaptive=True, finished="length", tokens=[1, 2, 3, 4],
        prompt_len=2, generated=[3, 4], step_log=[[2, 1]])
    writer.write(state)
    real_write = writer._file.write

    def full_disk(text):
        real_write(text[: len(text) // 2])  # half the record reaches the file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer._file, "write", full_disk)
    writer.write(state)  # no exception: the request that ended is not failed by its trace
    writer.write(state)
    monkeypatch.setattr(writer._file, "write", real_write)
    writer.write(state)  # space again
    writer.close()
    assert writer.dropped == 2
    _, requests = read_trace(path)  # every line whole
    assert len(requests) == 2


def test_kernels_that_fail_to_compile_fall_back_to_torch_with_a_note(monkeypatch, capsys):
    from torch.utils import cpp_extension

    from specdec import kernels
    from specdec.models.llama import FastLlama
    from specdec.models.backend_choice import make_backend
    from specdec.models.loading import model_info

    def broken_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension 'specdec_cpu_llama': g++ failed\nmore lines")

    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    info = model_info("tiny", model, None, torch.device("cpu"), torch.float32)
    monkeypatch.setattr(kernels, "unavailable_reason", lambda: None)  # as on a CPU the kernels build for
    monkeypatch.setattr(cpp_extension, "load", broken_compiler)
    kernels._build.cache_clear()
    try:
        backend = make_backend(model, info, "auto")
    finally:
        kernels._build.cache_clear()
    assert isinstance(backend, FastLlama)
    err = capsys.readouterr().err
    assert "building the CPU kernels failed: Error building extension" in err and "using the torch backend" in err


def test_a_suffix_index_write_killed_or_out_of_space_keeps_the_last_whole_file(tmp_path, monkeypatch, capsys):
    """A kill mid-write leaves the last whole index file; a full disk is said once, drafting and learning go on
    from memory, and the next write after space returns holds everything learnt meanwhile."""
    import safetensors.torch

    from specdec.drafters.lookup.suffix import SuffixDrafter, SuffixIndex

    path = tmp_path / "index.safetensors"
    index = SuffixIndex.open(path, vocab_size=64)
    drafter = SuffixDrafter(shared=index)
    drafter.learn([10, 11, 12, 13])  # the first output is written at once
    good = path.read_bytes()
    real_save = safetensors.torch.save_file

    def killed(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(50)
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", killed)
    index.store([20, 21, 22])
    with pytest.raises(KeyboardInterrupt):
        index.save()
    assert path.read_bytes() == good and not list(tmp_path.glob(".*tmp*"))
    assert list(SuffixIndex.load(path, vocab_size=64).sequences) == [[10, 11, 12, 13]]

    def full_disk(tensors, filename, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    for output in ([30, 31, 32], [40, 41]):
        index.saved_at = float("-inf")  # a write is due
        drafter.learn(output)  # no exception: the request that taught it is not failed
    assert capsys.readouterr().err.count("could not write suffix index") == 1
    assert path.read_bytes() == good and index.write_error
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    index.saved_at = float("-inf")
    drafter.learn([50, 51])
    assert index.write_error is None
    assert list(SuffixIndex.load(path, vocab_size=64).sequences) == [[10, 11, 12, 13], [20, 21, 22], [30, 31, 32],
                                                                     [40, 41], [50, 51]]


def test_a_full_disk_under_a_command_is_one_line_and_a_non_zero_exit(tmp_path, monkeypatch, capsys, tiny_folder):
    """Any command that meets a full disk (here the index file `suffix-index build` writes) says so in one line."""
    import safetensors.torch

    from specdec.cli.main import main

    def full_disk(tensors, filename, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(filename))

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    (tmp_path / "corpus.txt").write_text("red cat sat on big tree then\n")
    out = tmp_path / "index.safetensors"
    rc = main(["suffix-index", "build", "--model", str(tiny_folder), "--out", str(out), str(tmp_path / "corpus.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.strip().count("\n") == 0 and "No space left on device" in err and "Traceback" not in err
