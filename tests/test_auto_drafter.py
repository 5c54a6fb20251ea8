"""`auto` where the CPU kernels do not run the target (the torch backend, as on a GPU): with an EAGLE head shipped
for the model it builds the select drafter over that head and prompt lookup, which drafts each step with the one
whose measured yield under the verify-cost curve is the highest; greedy output stays plain decoding's.

The shipped head is stood in for by one saved for a tiny model (bundled_head patched). A "counting" target (its next
token is always the current one plus 1) and heads built by hand make one candidate clearly pay: a head that counts
drafts every token right where prompt lookup only finds decoys, and a random head loses to prompt lookup where the
prompt holds the continuation.
"""
import pytest
import torch

import specdec.drafters as drafters
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.costs import CostModel
from specdec.drafters import create_drafter
from specdec.drafters.routing.auto import AUTO_SELECT
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.routing.select import SelectingDrafter
from specdec.engine import SpecDecoder
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama

VOCAB, HIDDEN = 64, 32


class FixedCurve(CostModel):
    """A verify-cost curve as given, not moved by the passes timed here (the drafters' own costs are measured)."""

    def observe_verify(self, T: int, seconds: float, weight: float = 0.1, sequences: int = 1) -> None:
        pass


def flat() -> CostModel:
    """A verify curve as a large target's on a GPU: a pass over 64 tokens costs about what a pass over one does, and
    a pass costs more than drafting (a second: more than the heads' drafting measured here, even on a busy CPU)."""
    return FixedCurve({1: 1.0, 64: 1.02})


def counting_llama():
    """A tiny Llama whose greedy next token is the current one plus 1 (mod VOCAB): its layers add nothing to the
    residual stream (o_proj and down_proj zero), and its LM head scores token j by the (unit) embedding of j - 1,
    20 times over (a head reading the same LM head is then confident)."""
    model = tiny_llama(seed=0, vocab=VOCAB, hidden=HIDDEN)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = torch.nn.functional.normalize(torch.randn(VOCAB, HIDDEN, generator=gen), dim=-1)
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed.roll(1, 0) * 20)  # row j: the embedding of j - 1, scaled: confident
    return model


def saved_head(model, folder, counts: bool):
    """An EAGLE head for `model`, saved in `folder`: one that counts as the target does (it passes the drafted
    token's embedding through: its layer adds nothing), or one that drafts from a random mix of its inputs."""
    head = new_head(model, "tiny", torch.arange(VOCAB))
    with torch.no_grad():
        head.o_proj.weight.zero_()
        head.down_proj.weight.zero_()
        head.fc.bias.zero_()
        if counts:
            head.fc.weight.zero_()
            head.fc.weight[:, :HIDDEN] = torch.eye(HIDDEN)  # the embedding half: the token just drafted
        else:
            head.fc.weight.copy_(torch.randn(head.fc.weight.shape, generator=torch.Generator().manual_seed(2)))
    head.save(folder, dtype=torch.float32)
    return folder


@pytest.fixture
def shipped(monkeypatch, tmp_path):
    """ship(model, counts): patches bundled_head to give a head saved for the tiny model as if shipped with specdec."""

    def ship(model, counts: bool = True):
        folder = saved_head(model, tmp_path / f"head_{counts}", counts)
        fake = lambda name, kind="eagle": folder if kind == "eagle" else None  # noqa: E731
        monkeypatch.setattr(drafters.routing.auto, "bundled_head", fake)  # what auto reads
        monkeypatch.setattr(drafters, "bundled_head", fake)  # what the eagle drafter loads

    return ship


def test_auto_on_the_torch_backend_selects_between_the_shipped_head_and_prompt_lookup(shipped):
    model = tiny_llama(seed=0, hidden=HIDDEN)
    target = loaded(model, "torch")
    assert isinstance(create_drafter("auto", target), NgramDrafter)  # no head shipped: prompt lookup
    shipped(model)
    drafter = create_drafter("auto", target)
    assert isinstance(drafter, SelectingDrafter) and tuple(drafter.candidates) == AUTO_SELECT
    assert tuple(create_drafter("auto", target, select_from="suffix").candidates) == AUTO_SELECT  # auto's own
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4), costs=flat())
    assert drafted_keeping_greedy_output(decoder, target) > 0


def _steps_by_candidate(target, prompt: list[int], new_tokens: int) -> dict[str, int]:
    """Runs `prompt` with auto's drafter under the flat curve; checks the output is plain decoding's and returns
    how many steps each candidate drafted."""
    drafter = create_drafter("auto", target)
    assert isinstance(drafter, SelectingDrafter)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=8), costs=flat())
    config = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
    got, metrics = decoder.generate_ids(prompt, config)
    want, _ = SpecDecoder(target, None).generate_ids(prompt, config)
    assert got == want
    return {name: metrics.drafter_steps.get(name, 0) for name in AUTO_SELECT}


def test_auto_drafts_with_the_head_where_it_pays(shipped):
    """A head that counts drafts everything right; prompt lookup only finds decoys (5 6 7 followed by 20 and by
    nothing the target says). The selector drafts most steps with the head."""
    model = counting_llama()
    target = loaded(model, "torch")
    shipped(model, counts=True)
    prompt = [10, 11, 12, 5, 6, 7, 20, 21, 22, 5, 6, 7]
    want = [(prompt[-1] + 1 + i) % VOCAB for i in range(40)]
    assert SpecDecoder(target, None).generate_ids(prompt, GenerationConfig(max_new_tokens=40, ignore_eos=True))[0] \
        == want  # the target counts
    steps = _steps_by_candidate(target, prompt, 40)
    assert steps["eagle"] >= 3 and steps["eagle"] > 2 * steps["ngram"], steps


def test_auto_drafts_with_prompt_lookup_where_it_pays(shipped):
    """The prompt holds the continuation (the count up to 59 was written before), which prompt lookup drafts whole;
    the random head drafts nothing right. The selector drafts most steps with prompt lookup."""
    model = counting_llama()
    target = loaded(model, "torch")
    shipped(model, counts=False)
    prompt = list(range(60)) + list(range(5))
    steps = _steps_by_candidate(target, prompt, 50)
    assert steps["ngram"] >= 3 and steps["ngram"] > 2 * steps["eagle"], steps
