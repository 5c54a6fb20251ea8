"""Suffix drafting: the index's counts and bound, drafts from the request and from past outputs."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Budget, DraftRequest
from specdec.drafters.lookup.suffix import SuffixDrafter, SuffixIndex
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
    assert len(drafter.propose([50, 51, 10, 11], Budget(4))) == 0  # nothing seen yet
    drafter.learn([10, 11, 12, 13, 14, 15])
    other = drafter.fork()
    other.begin(DraftRequest(prompt_ids=[60, 61]))
    assert other.propose([60, 61, 10, 11], Budget(3)).tokens.tolist() == [12, 13, 14]
    assert other.propose([60, 61, 10, 11], Budget(10)).tokens.tolist() == [12, 13, 14, 15]  # the run ends there


def test_drafts_come_from_the_request_and_stop_where_continuations_split():
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 5, 9, 1, 2]
    # "1 2" -> 3 always (reach 1); "1 2 3" -> 5 twice, 4 once (reach 2/3); "1 2 3 5" -> 1 or 9 (reach 1/3)
    for floor, want in ((0.4, [3, 5]), (0.3, [3, 5, 1, 2, 3])):
        drafter = SuffixDrafter(min_n=2, min_probability=floor)
        drafter.begin(DraftRequest(prompt_ids=prompt))
        assert drafter.propose(prompt, Budget(5)).tokens.tolist() == want
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
    assert other.propose([1, 2, 10, 11], Budget(3)).tokens.tolist() == [12, 13, 14]
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


def test_store_all_keeps_exactly_what_storing_one_by_one_keeps():
    import random

    rng = random.Random(1)
    for trial in range(20):
        earlier = [[rng.randrange(5) for _ in range(rng.randrange(0, 12))] for _ in range(rng.randrange(0, 4))]
        batch = [[rng.randrange(5) for _ in range(rng.randrange(0, 30))] for _ in range(rng.randrange(0, 8))]
        one_by_one, at_once = SuffixIndex(max_n=3, max_tokens=40), SuffixIndex(max_n=3, max_tokens=40)
        for sequence in earlier:
            one_by_one.store(sequence)
            at_once.store(sequence)
        for sequence in batch:
            one_by_one.store(sequence)
        at_once.store_all(batch)
        assert list(at_once.sequences) == list(one_by_one.sequences), trial
        assert at_once.next_counts == one_by_one.next_counts and at_once.tokens == one_by_one.tokens


def test_an_index_file_names_its_tokenizer_and_is_refused_under_another(tmp_path, tiny_folder, tiny_draft_folder,
                                                                         other_vocab_folder):
    from specdec.drafters.lookup.suffix import tokenizer_id
    from specdec.models.loading import load_tokenizer

    (tiny, vocab), (draft, _), (other, other_vocab) = (load_tokenizer(str(f)) for f in
                                                      (tiny_folder, tiny_draft_folder, other_vocab_folder))
    assert vocab == other_vocab  # the same size: only the tokenizer's identity tells them apart
    assert tokenizer_id(tiny) == tokenizer_id(draft) != tokenizer_id(other)
    path = tmp_path / "index.safetensors"
    index = SuffixIndex.load(path, vocab, tokenizer=tokenizer_id(tiny), model="tiny")
    index.store([5, 6, 7])
    index.save()
    assert list(SuffixIndex.load(path, vocab, tokenizer=tokenizer_id(draft)).sequences) == [[5, 6, 7]]
    with pytest.raises(ConfigError, match="written for model tiny, whose tokenizer is not other's"):
        SuffixIndex.load(path, vocab, tokenizer=tokenizer_id(other), model="other")
    with pytest.raises(ConfigError, match="is not other's"):
        SuffixIndex.load(path, vocab, tokenizer=tokenizer_id(other), model="other", keep=False)
    unnamed = SuffixIndex.load(tmp_path / "unnamed.safetensors", vocab)  # as files written before names were kept
    unnamed.store([5, 6, 7])
    unnamed.save()
    assert list(SuffixIndex.load(unnamed.path, vocab, tokenizer=tokenizer_id(other)).sequences) == [[5, 6, 7]]


def test_a_corpus_is_read_from_text_files_folders_and_jsonl(tmp_path):
    import json

    from specdec.corpus import read_corpus

    (tmp_path / "docs" / "deep").mkdir(parents=True)
    (tmp_path / "docs" / ".git").mkdir()
    (tmp_path / "docs" / "a.md").write_text("alpha text\n")
    (tmp_path / "docs" / "deep" / "b.txt").write_text("beta text\n")
    (tmp_path / "docs" / ".git" / "HEAD").write_text("hidden\n")
    (tmp_path / "docs" / "image.png").write_bytes(b"\x89PNG\x00\x01")
    (tmp_path / "docs" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "docs" / "blank.txt").write_text("  \n")
    records = [{"text": "a whole document"}, {"prompt": "asked", "completion": "answered"},
               {"messages": [{"role": "user", "content": "a question"}, {"role": "assistant", "content": "reply one"},
                             {"role": "assistant", "content": [{"type": "text", "text": "reply two"}]}]},
               {"prompt": "no answer"}, ["not", "a", "record"]]
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    corpus = read_corpus([str(tmp_path / "docs"), str(tmp_path / "log.jsonl")])
    assert corpus.documents == ["alpha text\n", "beta text\n", "a whole document", "answered", "reply one", "reply two"]
    assert (corpus.files, corpus.skipped_files, corpus.skipped_records) == (4, 2, 2)
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        read_corpus([str(tmp_path / "bad.jsonl")])
    with pytest.raises(ConfigError, match="input not found: .*missing"):
        read_corpus([str(tmp_path / "docs"), str(tmp_path / "missing")])


def _build(capsys, *argv) -> tuple[int, str, str]:
    from specdec.cli.main import main

    rc = main(["suffix-index", "build", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _drafted(decoder, text: str, k: int = 8) -> str:
    """What the decoder's suffix drafter proposes after `text`, in a request whose prompt shares none of it."""
    tokenizer = decoder.target.tokenizer
    drafter = decoder.drafter.fork()
    drafter.begin(DraftRequest(prompt_ids=tokenizer.encode("we you", add_special_tokens=False)))
    context = tokenizer.encode("we you " + text, add_special_tokens=False)
    return tokenizer.decode(drafter.propose(context, Budget(k)).tokens.tolist())


def test_an_index_built_from_a_folder_drafts_the_corpus_continuations(capsys, tmp_path, tiny_folder):
    corpus = tmp_path / "corpus"
    (corpus / "notes").mkdir(parents=True)
    (corpus / "story.txt").write_text("red cat sat on big tree then\n")
    (corpus / "notes" / "more.txt").write_text("blue dog ran under green house again\n")
    (corpus / "blob.bin").write_bytes(b"\x00\x01\x02")
    out = tmp_path / "index.safetensors"
    rc, summary, err = _build(capsys, "--model", str(tiny_folder), "--out", str(out), str(corpus))
    assert rc == 0, err
    assert summary.startswith("2 files read (1 skipped as binary or not UTF-8): 2 documents, 14 tokens added;")
    decoder = SpecDecoder.load(str(tiny_folder), drafter="suffix", dtype="float32", calibrate=False,
                               suffix_index=str(out))  # the model, not only its tokenizer, accepts the file
    assert _drafted(decoder, "red cat") == "sat on big tree then"
    assert _drafted(decoder, "dog ran") == "under green house again"
    assert _drafted(decoder, "sun moon") == ""  # nothing the corpus holds


def test_append_keeps_the_earlier_corpus_and_a_plain_build_replaces_it(capsys, tmp_path, tiny_folder):
    first, second, out = tmp_path / "first.txt", tmp_path / "second.txt", tmp_path / "index.safetensors"
    first.write_text("red cat sat on big tree then\n")
    second.write_text("blue dog ran under green house again\n")
    common = ["--model", str(tiny_folder), "--out", str(out)]
    assert _build(capsys, *common, str(first))[0] == 0
    rc, summary, _ = _build(capsys, *common, "--append", str(second))
    assert rc == 0 and "holds 14 tokens in 2 sequences" in summary
    decoder = SpecDecoder.load(str(tiny_folder), drafter="suffix", dtype="float32", calibrate=False,
                               suffix_index=str(out))
    assert (_drafted(decoder, "red cat"), _drafted(decoder, "dog ran")) == ("sat on big tree then",
                                                                            "under green house again")
    assert _build(capsys, *common, str(second))[0] == 0
    decoder = SpecDecoder.load(str(tiny_folder), drafter="suffix", dtype="float32", calibrate=False,
                               suffix_index=str(out))
    assert (_drafted(decoder, "red cat"), _drafted(decoder, "dog ran")) == ("", "under green house again")


def test_a_corpus_beyond_the_index_bound_keeps_its_newest_text(capsys, tmp_path, tiny_folder, monkeypatch):
    from specdec.cli import suffix_index

    monkeypatch.setattr(suffix_index, "PIECE_TOKENS", 4)
    monkeypatch.setattr(SuffixIndex.__init__, "__defaults__", (8, 6))  # every index: max_n 8, max_tokens 6
    (tmp_path / "a.txt").write_text("red cat sat on big tree then\n")  # 7 tokens: runs of 4 and 3
    out = tmp_path / "index.safetensors"
    rc, summary, _ = _build(capsys, "--model", str(tiny_folder), "--out", str(out), str(tmp_path / "a.txt"))
    assert rc == 0 and summary.rstrip().endswith("holds 3 tokens in 1 sequence (cap 6; its oldest 4 tokens forgotten)")
