"""A greedy token's path through specdec stays short: from generate() to the model and back, plain decoding runs
the code of at most 10 of specdec's files (the API, the stream core, the scheduler, the request, its text,
verification, the config and the model's three), and never the draft-length policy or a drafter's."""
import functools
import os
import sys
from collections import Counter

import specdec
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model

PACKAGE = os.path.realpath(os.path.dirname(specdec.__file__))


@functools.lru_cache(maxsize=None)
def package_file(filename: str, package: str = PACKAGE) -> str | None:
    """`filename` relative to the package folder `package` (posix separators), or None if it lies outside it.

    Decided by the package's own path, not by a "/specdec/" substring: a clone in a folder named specdec holds
    its virtual environment's site-packages under such a path too."""
    if not os.path.isabs(filename):  # "<frozen abc>", "<string>": no file at all
        return None
    path = os.path.realpath(filename)
    if os.path.commonpath([path, package]) != package:
        return None
    return os.path.relpath(path, package).replace(os.sep, "/")


def _files_run(call) -> Counter:
    """specdec's files (relative to the package) whose functions `call` ran, with their call counts."""
    files = Counter()

    def profile(frame, event, arg):
        if event == "call":
            name = package_file(frame.f_code.co_filename)
            if name is not None:
                files[name] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


def test_plain_greedy_decoding_runs_ten_files(tiny_folder):
    decoder = SpecDecoder(load_model(str(tiny_folder), dtype="float32", backend="torch"), None)
    decoder.generate("a big red dog", max_new_tokens=4, ignore_eos=True)  # first-call imports and caches
    files = _files_run(lambda: decoder.generate("the small cat", max_new_tokens=8, ignore_eos=True))
    assert len(files) <= 10, sorted(files)
    assert not any(f.startswith("drafters/") or f == "policy.py" for f in files), sorted(files)


def test_only_the_package_folder_counts_as_specdec(tmp_path):
    """A clone named specdec with its venv inside: site-packages lie under .../specdec/ but are not specdec's."""
    clone = tmp_path / "specdec"
    package = clone / "specdec"
    assert package_file(str(package / "engine.py"), str(package)) == "engine.py"
    assert package_file(str(package / "models" / "llama.py"), str(package)) == "models/llama.py"
    site = clone / ".venv" / "lib" / "python3.11" / "site-packages"
    for outside in (site / "torch" / "nn" / "modules" / "module.py", site / "jinja2" / "runtime.py",
                    clone / "tests" / "conftest.py", tmp_path / "specdec_other" / "engine.py", "<frozen abc>"):
        assert package_file(str(outside), str(package)) is None, outside
