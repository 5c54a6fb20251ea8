"""The cache folder; writing files so that a reader never sees half of one (write under a temporary name, then rename), and reading
JSON Lines files line by line as their format defines lines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def cache_root() -> Path:
    """specdec's cache folder (converted models, built kernels, training data): SPECDEC_CACHE, else
    $XDG_CACHE_HOME/specdec, else ~/.cache/specdec."""
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "specdec"


def _new_file_mode() -> int:
    """The mode open() gives a new file under this process's umask. The umask can only be read by setting it, which
    is not safe once other threads create files, so it is read once, at import."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


NEW_FILE_MODE = _new_file_mode()


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Calls write(temporary_path) in path's folder, then renames the result to `path` (atomic on POSIX). An
    interrupted write leaves `path` as it was; the temporary file is removed when the write fails. The file gets the
    mode of any new file (NEW_FILE_MODE): safetensors creates its files readable by their owner only, and a head
    or model is often read by another user's process (an engine in a container)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.chmod(tmp, NEW_FILE_MODE)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_lines(path: Path) -> list[str]:
    """A UTF-8 text file's lines split at "\n" only, as JSON Lines defines them: a stray "\r" or U+2028 inside a
    line neither splits it nor shifts the numbers of the lines after it (Python's text mode would turn a lone "\r"
    into a line break). A "\r\n" line keeps its "\r", which JSON reads as whitespace."""
    return Path(path).read_bytes().decode("utf-8").split("\n")


def read_tensors(path: Path, what: str) -> dict:
    """The tensors of a safetensors file (never a pickle), or a one-line error naming `what` and the file when it
    is missing, truncated or not safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .errors import IncompatibleDraftError, first_line

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise IncompatibleDraftError(
            f"{what} {path} cannot be read (damaged or not safetensors): {first_line(exc)}"
        ) from None


def tensor_names_problem(names, expected, optional=()) -> str | None:
    """What a tensor file's `names` hold beyond `expected` and lack of it (`optional` ones may be missing), the first
    four of each, or None when they match: the line a loader refuses a file in a foreign layout with."""
    unknown = sorted(set(names) - set(expected))
    missing = sorted(set(expected) - set(names) - set(optional))
    problems = [
        f"{what} {', '.join(keys[:4])}"
        for what, keys in (("unexpected tensors", unknown), ("missing tensors", missing))
        if keys
    ]
    return "; ".join(problems) or None
