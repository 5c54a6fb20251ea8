"""Suffix drafting: the index's counts and bound, drafts from the request and from past outputs."""
import pytest
import torch

from specdec.config import GenerationConfig, SpeculationConfig
from specdec.drafters.base import DraftRequest
from specdec.drafters.suffix import SuffixDrafter, SuffixIndex
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from tiny import loaded, tiny_llama


def test_index_counts_continuations_of_every_suffix_length():
    index = SuffixIndex(max_n=3)
    index.store([1, 2, 3, 1, 2, 4, 1, 2, 4])
    assert index.continuations([1, 2]) == {3: 1, 4: 2} and index.continuations([2, 3]) == {1: 1}
    assert index.next_token([9, 1, 2], min_n=1) == (4, 2, 2 / 3)  # most frequent after "1 2"
    assert index.next_token([3, 1, 2], min_n=1) == (4, 3, 1.0)  # "3 1 2" was followed by 4 only: longer match wins
    assert index.next_token([7, 8], min_n=1) is None
    assert index.next_token([5, 2], min_n=2) is None and index.next_token([5, 2], min_n=1)[0] in (3, 4)


def test_index_forgets_the_oldest_sequences_beyond_its_bound():
    index = SuffixIndex(max_n=2, max_tokens=8)
    index.store([1, 2, 3, 4])
    index.store([5, 6, 7, 8])
    assert index.next_token([1, 2], 2) is not None
    index.store([1, 2, 9, 9])  # 12 tokens stored: the first sequence goes, its counts with it
    assert index.tokens == 8 and len(index.sequences) == 2
    assert index.continuations([1, 2]) == {9: 1} and index.continuations([2, 3]) == {}


def test_forgetting_leaves_exactly_the_counts_of_the_sequences_kept():
    import random

    rng = random.Random(0)
    index = SuffixIndex(max_n=3, max_tokens=60)
    for _ in range(30):  # a small alphabet: runs with one and with several continuations, both forgotten
        index.store([rng.randrange(4) for _ in range(rng.randrange(2, 15))])
    fresh = SuffixIndex(max_n=3)
    for sequence in index.sequences:
        fresh.store(sequence)
    assert index.next_counts == fresh.next_counts and index.tokens <= 60


def test_drafts_come_from_past_outputs_shared_by_forks():
    drafter = SuffixDrafter(min_n=2)
    drafter.begin(DraftRequest(prompt_ids=[50, 51]))
    assert len(drafter.propose([50, 51, 10, 11], 4)) == 0  # nothing seen yet
    drafter.learn([10, 11, 12, 13, 14, 15])
    other = drafter.fork()
    other.begin(DraftRequest(prompt_ids=[60, 61]))
    assert other.propose([60, 61, 10, 11], 3).tokens.tolist() == [12, 13, 14]
    assert other.propose([60, 61, 10, 11], 10).tokens.tolist() == [12, 13, 14, 15]  # the run ends with the output


def test_drafts_come_from_the_request_and_stop_where_continuations_split():
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 5, 9, 1, 2]
    # "1 2" -> 3 always (reach 1); "1 2 3" -> 5 twice, 4 once (reach 2/3); "1 2 3 5" -> 1 or 9 (reach 1/3)
    for floor, want in ((0.4, [3, 5]), (0.3, [3, 5, 1, 2, 3])):
        drafter = SuffixDrafter(min_n=2, min_probability=floor)
        drafter.begin(DraftRequest(prompt_ids=prompt))
        assert drafter.propose(prompt, 5).tokens.tolist() == want
    with pytest.raises(ConfigError):
        SuffixDrafter(min_n=3, max_n=2)
    with pytest.raises(ConfigError):
        SuffixDrafter(min_probability=1.0)


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_a_repeated_request_is_drafted_from_its_first_answer(backend):
    target_model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    target = loaded(target_model, backend)
    decoder = SpecDecoder(target, SuffixDrafter(), SpeculationConfig(num_speculative_tokens=6, adaptive=False))
    baseline = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    prompt = torch.randint(0, 63, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    want = baseline.generate_ids(prompt, config)[0]
    first, _ = decoder.generate_ids(prompt, config)
    again, metrics = decoder.generate_ids(prompt, config)
    assert first == again == want
    assert metrics.mean_accepted_tokens > 4  # the second time, the first answer is drafted and accepted


def test_a_file_backed_index_keeps_past_outputs_across_processes(tmp_path):
    path = tmp_path / "outputs.safetensors"
    index = SuffixIndex.open(path, vocab_size=64)
    drafter = SuffixDrafter(shared=index)
    drafter.learn([10, 11, 12, 13, 14, 15])  # the first output is written at once
    drafter.learn([20, 21, 22])
    index.save()
    again = SuffixIndex.open(path, vocab_size=64)
    assert list(again.sequences) == [[10, 11, 12, 13, 14, 15], [20, 21, 22]] and again.next_counts == index.next_counts
    other = SuffixDrafter(shared=again)
    other.begin(DraftRequest(prompt_ids=[1, 2]))
    assert other.propose([1, 2, 10, 11], 3).tokens.tolist() == [12, 13, 14]
    with pytest.raises(ConfigError, match="vocabulary of 50"):
        SuffixIndex.open(path, vocab_size=50)
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match="could not read"):
        SuffixIndex.open(tmp_path / "junk.safetensors", vocab_size=64)
    with pytest.raises(ConfigError, match="does not exist"):
        SuffixIndex.open(tmp_path / "missing" / "x.safetensors", vocab_size=64)


def test_generate_reads_and_writes_the_suffix_index(tiny_folder, tmp_path):
    """Two `specdec generate` processes: the second drafts from the output the first left in the index file."""
    import json
    import subprocess
    import sys

    path = tmp_path / "outputs.safetensors"
    argv = [sys.executable, "-m", "specdec.cli.main", "generate", "the cat sat on", "--model", str(tiny_folder),
            "--dtype", "float32", "--max-new-tokens", "24", "--drafter", "suffix", "--suffix-index", str(path),
            "--no-adaptive", "--stats-json"]
    stats = []
    for _ in range(2):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        stats.append(json.loads(proc.stderr.strip().splitlines()[-1]))
        assert path.exists()
    assert stats[1]["accepted_tokens"] > stats[0]["accepted_tokens"]  # the second run drafts from the first output


def test_warm_up_outputs_are_not_learned(tiny_folder, tmp_path):
    """Loading runs a warm-up generation; a file-backed index must not collect it on every start."""
    path = tmp_path / "outputs.safetensors"
    decoder = SpecDecoder.load(str(tiny_folder), drafter="suffix", dtype="float32", suffix_index=str(path))
    assert len(decoder.drafter.shared.sequences) == 0
    decoder.generate_ids([5, 6, 7, 8], GenerationConfig(max_new_tokens=8, ignore_eos=True))
    assert len(decoder.drafter.shared.sequences) == 1
