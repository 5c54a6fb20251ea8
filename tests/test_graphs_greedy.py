"""Greedy speculative decoding through the graph path (shape-static passes, uncaptured on the CPU) gives plain
decoding's tokens and transformers' own, for every kind of drafter, alone and in batches."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter
from specdec.engine import SpecDecoder
from tiny import loaded, tiny_llama

DRAFTERS = ["ngram", "suffix", "draft-model", "layerskip", "eagle-tree", "eagle-chain"]


@pytest.fixture(scope="module")
def models():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2), tiny_llama(seed=7, hidden=32, heads=2, kv_heads=1)


def _prompts(vocab: int = 64) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    out = []
    for i, n in enumerate((3, 9, 20, 33)):
        p = torch.randint(0, vocab - 1, (n,), generator=gen).tolist()
        out.append(p + p[: n // 2] + p if i % 2 else p)  # repeated material, for the lookup drafters
    return out


def _drafter(kind: str, target, draft_model):
    if kind == "ngram":
        return NgramDrafter(min_n=1, max_n=3)
    if kind == "suffix":
        return SuffixDrafter(min_n=1)
    if kind == "draft-model":
        return DraftModelDrafter(loaded(draft_model, "torch", graphs="on").backend, 64)
    if kind == "layerskip":  # its passes exit early: they take the eager forward
        return create_drafter("layerskip", target, layerskip_layers=1)
    torch.manual_seed(1)
    head = new_head(target.hf_model, "tiny", torch.arange(64))
    return EagleDrafter(head, tree=kind == "eagle-tree", width=3)


def _transformers_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", DRAFTERS)
def test_speculation_through_the_graph_path_equals_plain_decoding_and_transformers(models, kind):
    target_model, draft_model = models
    target = loaded(target_model, "torch", graphs="on")
    runner = target.backend.pass_graphs
    static_passes = []
    run = runner.run
    runner.run = lambda *args: static_passes.append(run(*args)) or static_passes[-1]
    plain = SpecDecoder(loaded(target_model, "torch"), None)  # the eager forward
    spec = SpecDecoder(target, _drafter(kind, target, draft_model),
                       SpeculationConfig(num_speculative_tokens=5, adaptive=False))
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    drafted = 0
    for prompt in _prompts():
        got, metrics = spec.generate_ids(prompt, config)
        assert got == plain.generate_ids(prompt, config)[0], prompt
        reference = _transformers_greedy(target_model, prompt, 30)
        assert got[:len(reference)] == reference, prompt
        drafted += metrics.drafted_tokens
    assert drafted > 0
    assert sum(out is not None for out in static_passes) >= len(_prompts()) * 5  # decode and verify passes ran there


@pytest.mark.parametrize("kind", ["ngram", "draft-model"])
def test_a_batch_through_the_graph_path_equals_one_at_a_time(models, kind):
    target_model, draft_model = models
    target = loaded(target_model, "torch", graphs="on")
    spec = SpecDecoder(target, _drafter(kind, target, draft_model), SpeculationConfig(num_speculative_tokens=4))
    alone = SpecDecoder(loaded(target_model, "torch"), None)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    prompts = _prompts() * 2  # 8 rows, joining between steps
    want = [alone.generate_ids(p, config)[0] for p in prompts]
    engine = spec.batch_engine(max_batch=5)
    got, queue = {}, list(enumerate(prompts))
    while queue or len(engine):
        while queue and engine.free_slots:
            i, p = queue.pop(0)
            engine.submit(i, p, config)
        for event in engine.step():
            got.setdefault(event.request_id, []).extend(event.new_tokens)
    assert [got[i] for i in range(len(prompts))] == want


def test_the_cli_runs_the_graph_path_on_the_cpu_with_the_same_text(capsys, tiny_folder):
    from cli_runner import run_cli

    common = ["generate", "the cat sat on the mat", "--model", str(tiny_folder), "--dtype", "float32",
              "--max-new-tokens", "16", "--drafter", "ngram", "--backend", "torch"]
    rc, eager, _ = run_cli(capsys, *common, "--graphs", "off")
    rc2, graphs, _ = run_cli(capsys, *common, "--graphs", "on")
    assert rc == rc2 == 0 and eager.strip() and graphs == eager


@pytest.mark.parametrize("argv,message", [(["--graphs", "on", "--backend", "hf"], "needs the torch backend"),
                                          (["--graphs", "sometimes"], "invalid choice"),
                                          (["--compile", "on", "--graphs", "off", "--backend", "torch"],
                                           "needs --graphs on"),
                                          (["--compile", "sometimes"], "invalid choice")])
def test_the_cli_refuses_graphs_it_cannot_give_in_one_line(capsys, tiny_folder, argv, message):
    from cli_runner import run_cli

    rc, out, err = run_cli(capsys, "generate", "the cat", "--model", str(tiny_folder), "--dtype", "float32", *argv)
    assert rc != 0 and message in err and len(err.strip().splitlines()) == 1
