"""A greedy token's path through specdec stays short: from generate() to the model and back, plain decoding runs
the code of at most 8 of specdec's files (the API, the scheduler, the request, verification, the config and the
model's three), and never the draft-length policy or a drafter's."""
import sys
from collections import Counter

from specdec.engine import SpecDecoder
from specdec.models.loading import load_model


def _files_run(call) -> Counter:
    """specdec's files (relative to the package) whose functions `call` ran, with their call counts."""
    files = Counter()

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and "/specdec/" in name:
            files[name.rsplit("/specdec/", 1)[1]] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


def test_plain_greedy_decoding_runs_eight_files(tiny_folder):
    decoder = SpecDecoder(load_model(str(tiny_folder), dtype="float32", backend="torch"), None)
    decoder.generate("a big red dog", max_new_tokens=4, ignore_eos=True)  # first-call imports and caches
    files = _files_run(lambda: decoder.generate("the small cat", max_new_tokens=8, ignore_eos=True))
    assert len(files) <= 8, sorted(files)
    assert not any(f.startswith("drafters/") or f == "policy.py" for f in files), sorted(files)
