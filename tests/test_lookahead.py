"""Lookahead decoding: the Jacobi window's tree and steps, the pool it fills, losslessness (greedy and sampled),
the cost decision, and option checks."""
import json
from collections import Counter
from dataclasses import replace

import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.lookup.jacobi import JacobiWindow
from specdec.drafters.lookup.lookahead import FIRST_PAUSE, LookaheadDrafter, pool_guesses, trie
from specdec.drafters.lookup.suffix import SuffixIndex
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.models.loading import LoadedModel
from specdec.verify import tree_mask
from stats import P_VALUE_FLOOR, fit_p_value
from tiny import TableLM, drafted_keeping_greedy_output, loaded, table_target, tiny_llama


# ---- the window and the pool, alone --------------------------------------------------------------------------
def test_window_tree_follows_the_papers_mask():
    """Cell (l, c) sees the root, level 0 up to column c, then its column up to itself; its depth is c + l."""
    window = JacobiWindow(3, 3, [0, 10, 11, 20, 21, 22])  # levels [[_, 10, 11], [20, 21, 22]]
    tokens, parents = window.tree()
    assert tokens == [10, 11, 20, 21, 22] and parents == [-1, 0, -1, 0, 1]
    seen = tree_mask(parents)  # row 0: the root; row i + 1: node i
    assert seen[5].tolist() == [True, True, True, False, False, True]  # (1, 2): root, (0, 1), (0, 2), itself
    assert seen[3].tolist() == [True, False, False, True, False, False]  # (1, 0): root, itself
    assert window.top_nodes() == [2, 3, 4]


def test_window_steps_shift_levels_and_yield_columns_once_filled():
    window = JacobiWindow(2, 3, [0, 1, 2, 3])  # levels [[_, 1], [2, 3]]: prompt tokens, not the target's
    assert window.advance(root=9, choices=[4, 5]) == []  # level 0 still holds starting tokens
    assert window.levels == [[2, 3], [4, 5]]
    assert window.advance(root=8, choices=[6, 7]) == [[8, 4, 6]]  # column 0 starts at the root; column 1 at 3
    assert window.levels == [[4, 5], [6, 7]]
    assert window.advance(root=7, choices=[1, 2]) == [[7, 6, 1], [5, 7, 2]]
    with pytest.raises(ValueError):
        window.advance(root=7, choices=[6])


def test_pool_guesses_are_the_most_frequent_continuations_merged_into_a_trie():
    pool = SuffixIndex(max_n=2)
    for gram in ([5, 1, 2], [5, 1, 2], [5, 1, 3], [5, 4, 4], [7, 7, 7]):
        pool.store(gram)
    assert pool_guesses(pool, 5, depth=2, count=2) == [[1, 2], [1, 3]]
    assert pool_guesses(pool, 5, depth=1, count=5) == [[1], [4]]
    assert pool_guesses(pool, 6, depth=2, count=5) == []
    assert trie([[1, 2], [1, 3], [4]]) == ([1, 2, 3, 4], [-1, 0, 0, -1])


# ---- through the engine -------------------------------------------------------------------------------------
def bigram_target(vocab: int = 12) -> LoadedModel:
    """A table target whose next token depends on the previous one only, greedily a fixed permutation: Jacobi
    iterations reach its text within N - 1 steps, and every column the window yields is its exact continuation."""
    lm = TableLM(vocab, seed=0)
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(2))
    table[torch.arange(vocab), torch.randperm(vocab, generator=torch.Generator().manual_seed(1))] += 10.0
    lm.table = table[None].expand(vocab, vocab, vocab).clone()  # (prev2, prev1) -> logits of prev1 alone
    return LoadedModel(name="bigram", hf_model=None, tokenizer=None, backend=lm)


class KeepsPool(LookaheadDrafter):
    """Keeps the n-grams its request pooled, for inspection."""

    def end(self):
        self.pooled = [list(s) for s in self.pool.sequences]
        super().end()


@pytest.mark.parametrize("window,ngram,guesses", [(2, 2, 1), (4, 3, 6), (5, 4, 5), (3, 5, 2)])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_output_is_plain_decodings(window, ngram, guesses, adaptive):
    target = loaded(tiny_llama())
    drafter = LookaheadDrafter(window, ngram, guesses)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=6, adaptive=adaptive))
    assert drafted_keeping_greedy_output(decoder, target, new_tokens=40) > 0
    assert drafter.stats.lookahead_steps > 0


def test_greedy_output_through_transformers_forward():
    """The window's tree mask and positions as transformers' own forward takes them (a 4-D mask)."""
    target = loaded(tiny_llama(), backend="hf")
    decoder = SpecDecoder(target, LookaheadDrafter(4, 4, 4), SpeculationConfig(6, adaptive=False))
    assert drafted_keeping_greedy_output(decoder, target, lengths=(5, 12), new_tokens=24) > 0


def test_the_pool_fills_from_the_window_and_its_guesses_are_accepted():
    """On the repetitive text of a bigram target the pooled n-grams are the target's own continuations and are
    accepted; without the window's steps (the target's choices never read back) nothing is pooled or accepted."""
    target = bigram_target()
    table = target.backend.table[0]
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True)
    plain, _ = SpecDecoder(target, None).generate_ids([3, 7], config)
    drafter = KeepsPool(window=5, ngram=4, guesses=5)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=8, adaptive=False))
    out, metrics = decoder.generate_ids([3, 7], config)
    assert out == plain
    exact = [g for g in drafter.pooled if all(int(table[a].argmax()) == b for a, b in zip(g, g[1:]))]
    assert drafter.stats.harvested == len(drafter.pooled) > 0
    assert len(exact) >= 0.75 * len(drafter.pooled)  # all but column 0's, whose first token is the root
    assert drafter.stats.guess_accepted > 20 and metrics.mean_accepted_tokens > 2.2

    blind = KeepsPool(window=5, ngram=4, guesses=5)
    blind.scored = lambda draft, choices, path: None
    out, metrics = SpecDecoder(target, blind, SpeculationConfig(8, adaptive=False)).generate_ids([3, 7], config)
    assert out == plain and blind.pooled == [] and metrics.mean_accepted_tokens < 1.5


def test_the_window_pauses_where_its_wide_passes_cannot_pay():
    """A verify curve where a few tokens cost little more than one but a pass's cost then grows with its tokens (a
    compute-bound CPU): after its warm-up the window pauses, longer each time it loses, and meanwhile the pool's
    guesses are drafted alone; on a flat curve (a GPU) the window keeps running."""
    from specdec.costs import CostModel

    class FixedCurve(CostModel):
        def observe_verify(self, T, seconds, weight=0.1, sequences=1):
            pass  # the table target's own timings would replace the curve

    target = bigram_target()
    config = GenerationConfig(max_new_tokens=120, ignore_eos=True)
    runs, pauses = {}, []
    for name, table in (("steep", {1: 1.0, 4: 1.3, 64: 30.0}), ("flat", {1: 1.0, 64: 1.0})):
        drafter = LookaheadDrafter(window=5, ngram=4, guesses=5)
        decoder = SpecDecoder(target, drafter, SpeculationConfig(8), costs=FixedCurve(table))
        decoder.generate_ids([3, 7], config)
        runs[name] = drafter.stats
        pauses.append(drafter.pause.length)
        decoder.generate_ids([5], config)  # the pause carries on into the next request, and keeps doubling
        pauses.append(drafter.pause.length)
    assert runs["steep"].lookahead_steps < 0.5 * runs["flat"].lookahead_steps
    assert runs["steep"].chain_steps > 20
    assert runs["flat"].chain_steps == 0
    assert pauses[2:] == [FIRST_PAUSE, FIRST_PAUSE] and FIRST_PAUSE < pauses[0] < pauses[1]


def test_in_a_batch_the_pool_drafts_chains_and_the_output_stays():
    """Alone, a request drafts trees and its window fills the pool; joined by others (chains only), it drafts the
    pool's best guess as a chain."""
    target = bigram_target()
    decoder = SpecDecoder(target, LookaheadDrafter(5, 4, 5), SpeculationConfig(4, adaptive=False))
    engine = decoder.batch_engine(max_batch=3)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    prompts = {"a": [3, 7], "b": [5], "c": [1, 2, 4]}
    states = {"a": engine.submit("a", prompts["a"], config)}
    for _ in range(8):
        engine.step()
    assert states["a"].drafter.stats.lookahead_steps > 0 and states["a"].drafter.stats.chain_steps == 0
    states |= {rid: engine.submit(rid, prompts[rid], config) for rid in ("b", "c")}
    while len(engine):
        engine.step()
    assert states["a"].drafter.stats.chain_steps > 0
    plain = SpecDecoder(target, None)
    for rid, state in states.items():
        assert state.generated == plain.generate_ids(prompts[rid], config)[0]


def test_select_passes_the_window_its_scores():
    target = bigram_target()
    drafter = create_drafter("select", target, select_from="lookahead,ngram")
    decoder = SpecDecoder(target, drafter, SpeculationConfig(8, adaptive=False))
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True)
    out, metrics = decoder.generate_ids([3, 7], config)
    assert out == SpecDecoder(target, None).generate_ids([3, 7], config)[0]
    assert drafter.candidates["lookahead"].stats.harvested > 0 and metrics.drafter_steps.get("lookahead", 0) > 0


def test_a_server_with_lookahead_serves_requests_alone_and_together(tiny_folder):
    """The engine worker with lookahead as its drafter: a request alone (trees), then three at once (chains); each
    text is plain decoding's."""
    pytest.importorskip("fastapi")
    from specdec.models.loading import load_model
    from specdec.server.schemas import SpeculationChoice
    from specdec.server.worker import Delta, EngineWorker, Finished
    from test_server_worker import request, submit, until_end

    target = load_model(str(tiny_folder), dtype="float32")
    worker = EngineWorker(SpecDecoder(target, LookaheadDrafter(), SpeculationConfig(4, adaptive=False)), max_batch=3)
    plain = SpecDecoder(target, None, chat=False)  # completions are not templated
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    worker.start()
    try:
        for prompts in (["the cat sat on the mat"], ["the dog ran", "a red house and a red tree", "we see the sun"]):
            queues = [submit(worker, f"{len(prompts)}-{i}", replace(request(prompt, max_tokens=24),
                                                                   speculation=SpeculationChoice("lookahead")))
                      for i, prompt in enumerate(prompts)]
            for prompt, events in zip(prompts, queues):
                seen = until_end(events, timeout=120)
                assert isinstance(seen[-1], Finished) and seen[-1].drafter == "lookahead"
                assert "".join(e.text for e in seen if isinstance(e, Delta)) == plain.generate(prompt, config).text
    finally:
        worker.stop()


# ---- sampling: the engine's tree rules, over trees that hold the window ------------------------------------------
@pytest.mark.parametrize("verifier,sampling", [("rejection", SamplingConfig(temperature=0.8, top_k=4,
                                                                            repetition_penalty=1.5)),
                                               ("coupled", SamplingConfig(temperature=1.3, top_p=0.9))])
def test_sampled_output_follows_the_target_distribution(verifier, sampling):
    from test_sampling_lossless import PROMPT, exact_distribution

    length = 4
    target = table_target(5, seed=0)
    drafter = LookaheadDrafter(window=3, ngram=2, guesses=2)  # n-grams pooled from the first step on
    decoder = SpecDecoder(target, drafter, SpeculationConfig(4, adaptive=False, sampling_verifier=verifier))
    counts, accepted = Counter(), 0
    for seed in range(6000):
        config = GenerationConfig(max_new_tokens=length, ignore_eos=True, sampling=replace(sampling, seed=seed))
        tokens, metrics = decoder.generate_ids(PROMPT, config)
        counts[tuple(tokens)] += 1
        accepted += metrics.accepted_tokens
    assert accepted > 1000  # the trees were right often enough for the test to see their rule
    assert fit_p_value(counts, exact_distribution(target.backend, PROMPT, length, sampling)) > P_VALUE_FLOOR


# ---- options ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options,message", [
    ({"lookahead_window": 1}, "lookahead_window (--lookahead-window, W) must be an integer in [2, 32], got 1"),
    ({"lookahead_ngram": 9}, "lookahead_ngram (--lookahead-ngram, N) must be an integer in [2, 8], got 9"),
    ({"lookahead_guesses": 0}, "lookahead_guesses (--lookahead-guesses, G) must be an integer in [1, 32], got 0"),
    ({"lookahead_window": True}, "lookahead_window"),
    ({"lookahead_ngram": "4"}, "lookahead_ngram"),
    ({"lookahead_depth": 3}, "unknown drafter option lookahead_depth"),
])
def test_bad_options_are_refused_naming_them(options, message):
    with pytest.raises(ConfigError, match=None) as info:
        create_drafter("lookahead", table_target(), **options)
    assert message in str(info.value)


def test_the_command_line_takes_the_options_and_refuses_bad_ones(capsys, tiny_folder):
    from test_cli import run_cli

    common = ["generate", "the cat sat", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "16"]
    rc, out, err = run_cli(capsys, *common, "--drafter", "lookahead", "--lookahead-window", "3", "--lookahead-ngram",
                           "4", "--lookahead-guesses", "2", "--no-adaptive", "--stats-json")
    assert rc == 0 and json.loads(err.strip().splitlines()[-1])["drafted_tokens"] > 0
    assert out == run_cli(capsys, *common, "--drafter", "none")[1]
    rc, _, err = run_cli(capsys, *common, "--drafter", "lookahead", "--lookahead-ngram", "1")
    assert rc == 2 and err.strip().splitlines() == [
        "specdec generate: error: lookahead_ngram (--lookahead-ngram, N) must be an integer in [2, 8], got 1"]


# ---- the real model -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_model_greedy_output_is_plain_decodings():
    from pathlib import Path

    from specdec.models.loading import load_model
    target = load_model("smollm2-135m")  # as users run it: its Q4_1 file where the kernels run
    dev = Path("/work/shared/data/specbench_dev.jsonl")  # the project's Spec-Bench dev set, where present
    rows = [json.loads(line) for line in dev.read_text().splitlines()] if dev.is_file() else []
    questions = [rows[i]["turns"][0] for i in (20, 25)] if len(rows) > 25 else [  # a coding and an extraction task
        "List the days of the week.", "Write a Python function that reverses a list."]
    plain = SpecDecoder(target, None)
    decoder = SpecDecoder(target, LookaheadDrafter(), SpeculationConfig(8, adaptive=False))
    config = GenerationConfig(max_new_tokens=32)
    accepted = 0
    for question in questions:
        result = decoder.generate(question, config)
        assert result.token_ids == plain.generate(question, config).token_ids
        accepted += result.metrics.accepted_tokens
    assert accepted > 0
