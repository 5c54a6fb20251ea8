"""LOSSY acceptance rules (specdec/verify/lossy.py): parsing, each rule on hand-built rows, what they share with the
exact rules (top-k:1 is exact greedy, on chains and trees; no rule accepts less than exact), and the engine running
them."""
import math

import pytest
import torch

from specdec.config import EXACT, Acceptance, GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.sampling import probs_from_logits
from specdec.verify import Draft, acceptable, greedy_verify, lossy_verify, tree_greedy_verify, verify
from tiny import loaded, tiny_llama

GREEDY = SamplingConfig()


@pytest.mark.parametrize("text,mode,value", [("exact", "exact", None), ("top-k:4", "top-k", 4),
                                             ("threshold:0.3", "threshold", 0.3), ("threshold:1", "threshold", 1.0),
                                             ("typical:0.2", "typical", 0.2), (" top-k:1 ", "top-k", 1)])
def test_acceptance_specs_parse_and_print_back(text, mode, value):
    acceptance = Acceptance.parse(text)
    assert (acceptance.mode, acceptance.value) == (mode, value)
    assert acceptance.lossy == (mode != "exact")
    assert Acceptance.parse(str(acceptance)) == acceptance


@pytest.mark.parametrize("text", ["top-k:0", "top-k:-1", "top-k:2.5", "top-k", "threshold:2", "threshold:0",
                                  "threshold:nan", "typical:x", "typical:1", "typical:0", "exact:3", "foo", ""])
def test_bad_acceptance_specs_are_refused_naming_the_forms(text):
    with pytest.raises(ConfigError, match=r"exact, top-k:K .*threshold:P .*typical:EPS"):
        Acceptance.parse(text)


def test_exact_is_the_default_and_a_spec_string_is_parsed_into_the_config():
    assert SpeculationConfig().acceptance == EXACT and not EXACT.lossy
    assert SpeculationConfig(acceptance="top-k:3").acceptance == Acceptance("top-k", 3)
    with pytest.raises(ConfigError):
        SpeculationConfig(acceptance="top-k:0")


def _row(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log().unsqueeze(0)  # (1, V) logits whose softmax is probs


@pytest.mark.parametrize("rule,accepted", [
    ("top-k:1", [0]), ("top-k:2", [0, 1]), ("top-k:3", [0, 1, 2]),
    ("threshold:0.31", [0]), ("threshold:0.29", [0, 1]), ("threshold:0.25", [0, 1]), ("threshold:0.19", [0, 1, 2]),
    ("threshold:1", [0]),  # the argmax is always accepted
    # H(.5, .3, .2, 0) = 1.0297 nats, exp(-H) = .3571: min(eps, sqrt(eps) exp(-H)) = .09 (eps .09), .2525 (.5), .3388 (.9)
    ("typical:0.09", [0, 1, 2]), ("typical:0.5", [0, 1]), ("typical:0.9", [0]),
])
def test_each_rule_accepts_where_it_must(rule, accepted):
    """One row p = (.5, .3, .2, 0): each token is tried as the draft."""
    logits = _row([0.5, 0.3, 0.2, 0.0])
    probs = logits.softmax(-1)
    acceptance = Acceptance.parse(rule)
    got = [t for t in range(4) if acceptable(acceptance, torch.tensor([t]), logits, probs).item()]
    assert got == accepted


def test_typical_acceptance_follows_medusas_formula():
    """Over random rows: accepted iff p(d) > min(eps, sqrt(eps) exp(-H)), or d is the argmax."""
    gen = torch.Generator().manual_seed(0)
    for eps in (0.05, 0.3):
        logits = torch.randn(200, 12, generator=gen) * 2
        probs = logits.softmax(-1)
        tokens = torch.randint(0, 12, (200,), generator=gen)
        got = acceptable(Acceptance("typical", eps), tokens, logits, probs)
        for i in range(200):
            p = probs[i].double()
            entropy = -(p * p.log()).sum().item()
            bound = min(eps, math.sqrt(eps) * math.exp(-entropy))
            want = p[tokens[i]].item() > bound or tokens[i] == logits[i].argmax()
            assert bool(got[i]) == want


@pytest.mark.parametrize("rule", ["top-k:64", "threshold:0.01", "typical:0.5"])
def test_no_rule_accepts_a_token_the_row_rules_out(rule):
    """A masked token (a constraint's -inf, a sampler's filter) is never accepted, however loose the rule."""
    logits = torch.tensor([[0.0, -1.0, float("-inf"), -2.0]])
    got = acceptable(Acceptance.parse(rule), torch.tensor([2]), logits, logits.softmax(-1))
    assert not got.item()


def test_ties_rank_by_token_id_as_argmax_breaks_them():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])  # tokens 1 and 2 tie for the top
    probs = logits.softmax(-1)
    assert acceptable(Acceptance("top-k", 1), torch.tensor([1]), logits, probs).item()
    assert not acceptable(Acceptance("top-k", 1), torch.tensor([2]), logits, probs).item()
    assert acceptable(Acceptance("top-k", 2), torch.tensor([2]), logits, probs).item()


def test_a_chain_stops_at_its_first_rejected_draft_and_emits_that_rows_argmax():
    """The docstring's example: top-k:2, rows whose two likeliest are (5, 3), (1, 7), (2, 4)."""
    logits = torch.full((4, 10), -5.0)
    for row, (first, second) in enumerate([(5, 3), (1, 7), (2, 4), (8, 0)]):
        logits[row, first], logits[row, second] = 2.0, 1.0
    draft = Draft(tokens=torch.tensor([5, 7, 9]))
    assert verify(draft, logits, GREEDY, acceptance=Acceptance("top-k", 2)) == ([0, 1], 2)
    assert verify(draft, logits, GREEDY) == ([0], 1)  # exact: 7 is not row 1's argmax
    all_in = Draft(tokens=torch.tensor([3, 7, 4]))  # all accepted: the bonus is row 3's argmax
    assert verify(all_in, logits, GREEDY, acceptance=Acceptance("top-k", 2)) == ([0, 1, 2], 8)


def _random_case(gen, k: int, vocab: int = 8):
    logits = torch.randn(k + 1, vocab, generator=gen) * 1.5
    tokens = torch.randint(0, vocab, (k,), generator=gen)
    return logits, tokens


RULES = ["top-k:1", "top-k:2", "top-k:5", "threshold:0.6", "threshold:0.2", "typical:0.05", "typical:0.3"]
AS_EXACT = ("top-k:1", "threshold:0.6")  # a token with p > 1/2 is the argmax: these accept what exact greedy does


@pytest.mark.parametrize("rule", RULES)
def test_a_lossy_rule_never_accepts_fewer_drafts_than_exact_greedy(rule):
    gen = torch.Generator().manual_seed(1)
    acceptance, looser = Acceptance.parse(rule), 0
    for _ in range(300):
        logits, tokens = _random_case(gen, k=4)
        tokens[:2] = logits[:2].argmax(-1)  # some exact acceptances to keep
        exact_n, _ = greedy_verify(tokens, logits)
        path, token = lossy_verify(tokens, None, logits, GREEDY, acceptance)
        assert len(path) >= exact_n and path == list(range(len(path)))
        assert token == int(logits[len(path)].argmax())  # the next token is exact greedy's, from that row
        looser += len(path) > exact_n
    assert (looser == 0) == (rule in AS_EXACT)  # and accepts more somewhere, unless it is exact in effect


def test_top_k_1_on_trees_is_exact_greedy():
    gen = torch.Generator().manual_seed(3)
    parents = [-1, -1, 0, 0, 1, 2, 2, 4]
    for _ in range(200):
        logits, tokens = _random_case(gen, k=len(parents), vocab=4)  # a small vocabulary: many children match
        want = tree_greedy_verify(tokens, parents, logits)
        assert lossy_verify(tokens, parents, logits, GREEDY, Acceptance("top-k", 1)) == want


def test_a_tree_walks_to_the_most_probable_accepted_child():
    """Root row: p(3) = .5, p(1) = .3; both children pass top-k:2, the likelier (node 1, token 3) is walked."""
    logits = torch.full((4, 6), -9.0)
    logits[0, 3], logits[0, 1] = math.log(0.5), math.log(0.3)
    logits[2, 4] = 1.0  # node 1's row: its argmax 4, emitted after it
    path, token = lossy_verify(torch.tensor([1, 3, 5]), [-1, -1, 0], logits, GREEDY, Acceptance("top-k", 2))
    assert (path, token) == ([1], 4)


def test_sampling_uses_the_sampling_distribution_and_draws_the_next_token_exactly():
    """Sampling: rows are p after temperature and top-k; the token after the path is the coupled sample there."""
    sampling = SamplingConfig(temperature=0.7, top_k=3, seed=1)
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.5, 0.0], [0.0, 4.0, 3.0, 0.0, 0.0]])
    noise = torch.distributions.Gumbel(0.0, 1.0).sample((2, 5))
    rule = Acceptance("top-k", 3)
    # token 3 is 4th at row 0: filtered out by the request's top_k, so p(3) = 0 and top-k:3 cannot take it
    path, token = lossy_verify(torch.tensor([3]), None, logits, sampling, rule, noise=lambda depths: noise[depths])
    row0 = torch.softmax((logits[0] / 0.7).masked_fill(torch.arange(5) > 2, float("-inf")), -1)
    assert path == [] and token == int((row0.log() + noise[0]).argmax())
    path, token = lossy_verify(torch.tensor([2]), None, logits, sampling, rule, noise=lambda depths: noise[depths])
    row1 = probs_from_logits(logits[1], sampling)  # one token past the context: noise of depth 1
    assert path == [0] and token == int((row1.log() + noise[1]).argmax())


@pytest.fixture(scope="module")
def target():
    return loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2))


@pytest.fixture(scope="module")
def draft_backend():
    return loaded(tiny_llama(seed=7, hidden=32, heads=2, kv_heads=1)).backend


def _prompts(count: int = 6) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 63, (4 + 3 * i,), generator=gen).tolist() for i in range(count)]


def test_top_k_1_through_the_engine_gives_exact_greedy_output(target, draft_backend):
    """An unrelated random draft model (many rejections) and k = 4 every step: top-k:1 is plain greedy decoding."""
    plain = SpecDecoder(target, None)
    spec = SpecDecoder(target, DraftModelDrafter(draft_backend, 64),
                       SpeculationConfig(num_speculative_tokens=4, adaptive=False, acceptance="top-k:1"))
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    for prompt in _prompts():
        got, metrics = spec.generate_ids(prompt, config)
        assert got == plain.generate_ids(prompt, config)[0]
        assert metrics.drafted_tokens > 0 and metrics.lossy and metrics.acceptance == "top-k:1"


def test_a_loose_rule_accepts_more_of_a_random_drafters_tokens_than_exact(target, draft_backend):
    def accepted(rule):
        spec = SpecDecoder(target, DraftModelDrafter(draft_backend, 64),
                           SpeculationConfig(num_speculative_tokens=4, adaptive=False, acceptance=rule))
        runs = [spec.generate_ids(p, GenerationConfig(max_new_tokens=30, ignore_eos=True))[1] for p in _prompts()]
        return sum(m.accepted_tokens for m in runs) / sum(m.drafted_tokens for m in runs), runs[0]

    exact, exact_metrics = accepted("exact")
    loose, loose_metrics = accepted("top-k:8")
    assert loose > exact
    assert not exact_metrics.lossy and exact_metrics.to_dict()["lossy"] is False
    assert loose_metrics.to_dict()["lossy"] is True and "LOSSY acceptance top-k:8" in loose_metrics.summary()


def test_plain_decoding_is_exact_whatever_acceptance_was_asked_for(target):
    decoder = SpecDecoder(target, None, SpeculationConfig(acceptance="threshold:0.1"))
    _, metrics = decoder.generate_ids(_prompts(1)[0], GenerationConfig(max_new_tokens=5))
    assert metrics.acceptance == "exact" and not metrics.lossy


def test_greedy_choices_are_torch_argmax_ties_included():
    """The CPU's fast argmax picks what torch.argmax picks: the first of equal maxima, in 1-D and 2-D, and torch's
    own on other dtypes."""
    from specdec.verify import greedy_choices

    gen = torch.Generator().manual_seed(0)
    for shape in [(7,), (3, 49152), (5, 11)]:
        scores = torch.randint(0, 4, shape, generator=gen).float()  # many ties
        assert torch.equal(greedy_choices(scores), scores.argmax(-1))
    rows = torch.randn(4, 100, generator=gen)
    assert torch.equal(greedy_choices(rows[:, ::2]), rows[:, ::2].argmax(-1))  # strided
    assert torch.equal(greedy_choices(rows.bfloat16()), rows.bfloat16().argmax(-1))
    assert greedy_choices(torch.tensor([1.0, 3.0, 3.0])).item() == 1
