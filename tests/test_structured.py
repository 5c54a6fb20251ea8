"""Structured output: the text follows the JSON schema, regex or grammar, and drafts never change it.

A tiny random model with a byte-level BPE tokenizer (the kind llguidance reads) writes constrained text; every
drafter (prompt lookup, the target drafting for itself, a tree) must give the tokens plain constrained decoding
gives, greedy and with seed-stable (coupled) sampling. Then the server's response_format and guided_* fields.
"""
import json
import re

import pytest
import torch

from specdec.config import Constraint, GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Draft, Drafter
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.models.loading import load_model
from specdec.structured import ConstraintState, check
from tiny import ModelLogits, TableTreeDrafter, loaded

SCHEMA = {"type": "object", "properties": {"name": {"enum": ["cat", "dog", "sun"]},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}
REGEX = r"(the|a) (cat|dog)( sat| ran| on the mat){0,3}\."
LARK = 'start: "[" item ("," item)* "]"\nitem: /[0-9]{1,3}/ | "red" | "blue"'


@pytest.fixture(scope="module")
def target(tiny_bpe_folder):
    return load_model(str(tiny_bpe_folder), dtype="float32")  # the kernels backend: bit-exact verify passes


def _drafters(target):
    hf = target.hf_model
    return {"ngram": NgramDrafter(min_n=1, max_n=3),
            "self": DraftModelDrafter(loaded(hf, "kernels").backend, hf.config.vocab_size),  # unconstrained drafts
            "tree": TableTreeDrafter(ModelLogits(hf), width=2, depth=3)}


def _valid(kind: str, text: str) -> bool:
    if kind == "json_schema":
        obj = json.loads(text)
        return set(obj) == {"name", "age"} and obj["name"] in ("cat", "dog", "sun") and 0 <= obj["age"] <= 99
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    return re.fullmatch(r"\[(([0-9]{1,3}|red|blue),)*([0-9]{1,3}|red|blue)\]", text) is not None


@pytest.mark.parametrize("kind,spec", [("json_schema", SCHEMA), ("regex", REGEX), ("lark", LARK)])
def test_greedy_constrained_text_is_valid_and_every_drafter_keeps_it(target, kind, spec):
    kwargs = {"json_schema": spec} if kind == "json_schema" else {"regex": spec} if kind == "regex" else {"grammar": spec}
    plain = SpecDecoder(target, None, chat=False)
    for prompt in ("the cat", "a big red dog ran", '{"name": "moon", "age": 7}'):
        want = plain.generate(prompt, max_new_tokens=60, **kwargs)
        assert want.finish_reason == "stop" and _valid(kind, want.text), want.text
        for name, drafter in _drafters(target).items():
            spec_decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False),
                                       chat=False)
            got = spec_decoder.generate(prompt, max_new_tokens=60, **kwargs)
            assert got.token_ids == want.token_ids, (name, got.text, want.text)


class _Silent(Drafter):
    """Drafts nothing: what a step drafts then comes from the constraint alone."""

    name = "silent"

    def propose(self, context, budget):
        return Draft.empty()


def test_tokens_the_schema_forces_are_drafted_and_accepted(target):
    schema = {"type": "object", "properties": {"a_rather_long_key_name": {"enum": ["cat", "dog"]}},
              "required": ["a_rather_long_key_name"], "additionalProperties": False}
    want = SpecDecoder(target, None, chat=False).generate("the cat", max_new_tokens=40, json_schema=schema)
    got = SpecDecoder(target, _Silent(), SpeculationConfig(num_speculative_tokens=8, adaptive=False),
                      chat=False).generate("the cat", max_new_tokens=40, json_schema=schema)
    assert got.token_ids == want.token_ids and json.loads(got.text)["a_rather_long_key_name"] in ("cat", "dog")
    assert got.metrics.accepted_tokens >= 4 and got.metrics.steps < want.metrics.steps


def test_coupled_sampling_with_a_constraint_is_the_same_with_and_without_drafts(target):
    """Coupled verification draws each position's sample from (seed, position): with the constraint's masks in the
    sampled distribution, drafts must not change a single token."""
    config = GenerationConfig.create(max_new_tokens=40, temperature=1.0, regex=REGEX)
    plain = SpecDecoder(target, None, SpeculationConfig(sampling_verifier="coupled"), chat=False)
    spec = SpecDecoder(target, NgramDrafter(min_n=1, max_n=3),
                       SpeculationConfig(num_speculative_tokens=4, adaptive=False, sampling_verifier="coupled"),
                       chat=False)
    texts = set()
    for seed in range(8):
        cfg = GenerationConfig.create(max_new_tokens=40, temperature=1.0, regex=REGEX, seed=seed)
        want = plain.generate("the dog", cfg)
        assert _valid("regex", want.text), want.text
        assert spec.generate("the dog", cfg).token_ids == want.token_ids
        texts.add(want.text)
    assert len(texts) > 2, "sampling should vary with the seed"
    assert config.constraint == Constraint("regex", REGEX)


def _exact_constrained_distribution(target, prompt: list[int], constraint: Constraint) -> dict:
    """P(output) for sampling at temperature 1 under the constraint, by walking every allowed token path with
    transformers' model (outputs end as the engine ends them: at an end-of-sequence token or a complete text)."""
    state = ConstraintState(constraint, target.tokenizer, target.info.vocab_size, target.info.eos_token_ids)
    eos, out = target.info.eos_token_ids, {}

    def visit(tokens: list[int], prob: float) -> None:
        with torch.no_grad():
            logits = target.hf_model(torch.tensor([prompt + tokens])).logits[0, -1]
        mask = state.row_masks([])[0]
        p = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        for t in mask.nonzero().flatten().tolist():
            if t in eos:
                out[tuple(tokens + [t])] = prob * p[t].item()
                continue
            complete = state.advance(t)
            if complete:
                out[tuple(tokens + [t])] = prob * p[t].item()
            else:
                visit(tokens + [t], prob * p[t].item())
            state.matcher.rollback(1)

    visit([], 1.0)
    return out


def test_rejection_sampling_with_a_constraint_keeps_the_constrained_distribution(target):
    """Drafts from the unconstrained model itself, checked by rejection sampling against the masked target: the
    outputs follow the exact constrained distribution (chi-square, as the other losslessness tests)."""
    from stats import P_VALUE_FLOOR, fit_p_value

    constraint = Constraint("regex", r"(the|a) (cat|dog)\.")
    prompt = target.tokenizer("the big", add_special_tokens=False)["input_ids"]
    exact = _exact_constrained_distribution(target, prompt, constraint)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-4) and len(exact) >= 4
    spec = SpecDecoder(target, DraftModelDrafter(loaded(target.hf_model, "kernels").backend, target.info.vocab_size),
                       SpeculationConfig(num_speculative_tokens=3, adaptive=False), chat=False)
    counts: dict = {}
    for seed in range(1500):
        config = GenerationConfig(max_new_tokens=20, constraint=constraint,
                                  sampling=GenerationConfig.create(temperature=1.0, seed=seed).sampling)
        tokens, _ = spec.generate_ids(prompt, config)
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    assert fit_p_value(counts, exact) > P_VALUE_FLOOR


def test_rejection_sampling_with_a_constraint_stays_valid_and_reproducible(target):
    spec = SpecDecoder(target, DraftModelDrafter(loaded(target.hf_model, "kernels").backend, target.info.vocab_size),
                       SpeculationConfig(num_speculative_tokens=3, adaptive=False), chat=False)
    outs = [spec.generate("the cat", max_new_tokens=50, temperature=0.8, seed=s, json_schema=SCHEMA) for s in (1, 1, 2)]
    assert all(_valid("json_schema", o.text) for o in outs)
    assert outs[0].token_ids == outs[1].token_ids


def test_row_masks_follow_each_path(target):
    """Row i + 1 allows what may follow draft i's own path; a refused draft's row copies its parent's."""
    state = ConstraintState(Constraint("regex", "ab|ac|b"), target.tokenizer, target.info.vocab_size,
                            target.info.eos_token_ids)
    tok = target.tokenizer
    a, b, c = (tok.convert_tokens_to_ids(x) for x in "abc")
    eos = target.info.eos_token_ids[0]
    masks = state.row_masks([a, b, c], parents=[-1, 0, 0])  # a -> b, a -> c (a tree)
    allowed = [set(m.nonzero().flatten().tolist()) for m in masks]
    assert {a, b} <= allowed[0] and c not in allowed[0]
    assert {b, c} <= allowed[1] and a not in allowed[1]
    assert allowed[2] == allowed[3] == {eos}  # "ab" and "ac" are complete: only the end may follow
    chain = state.row_masks([c, a])  # c is refused at the root: the rows after it copy the root's
    assert torch.equal(chain[1], chain[0]) and torch.equal(chain[2], chain[0])
    assert torch.equal(state.row_masks([])[0], masks[0])  # the matcher rolled every path back


def test_bad_constraints_are_refused(target):
    decoder = SpecDecoder(target, None, chat=False)
    for bad in (Constraint("regex", "[a-"), Constraint.json_schema({"type": "nonsense"}), Constraint("lark", "start: x")):
        with pytest.raises(ConfigError, match="invalid"):
            check(bad)
        with pytest.raises(ConfigError, match="invalid"):  # the engine refuses it too, when nothing checked it first
            decoder.generate("the cat", GenerationConfig(max_new_tokens=3, constraint=bad))
    for kwargs in (dict(regex="a", grammar="b"), dict(json_schema="{not json"), dict(json_schema="[1]"), dict(regex="")):
        with pytest.raises(ConfigError):
            GenerationConfig.create(**kwargs)


def test_a_tokenizer_llguidance_cannot_read_is_a_clear_error(tiny_folder):
    decoder = SpecDecoder(load_model(str(tiny_folder), dtype="float32"), None)
    with pytest.raises(ConfigError, match="structured output"):
        decoder.generate("the cat", max_new_tokens=4, regex="a+")


@pytest.fixture(scope="module")
def server(tiny_bpe_folder):
    pytest.importorskip("fastapi")
    from specdec.benchmarks.server_process import ServerProcess

    with ServerProcess(["--model", str(tiny_bpe_folder), "--dtype", "float32", "--threads", "1",
                        "--served-model-name", "tiny"]) as s:
        yield s


def test_server_response_format_and_guided_fields(server, target):
    """response_format json_schema / json_object and guided_regex give the engine's constrained text, streamed or
    not; a bad schema, two constraints at once or an unknown format type are a 400 naming the field."""
    openai = pytest.importorskip("openai")
    import httpx

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    engine = SpecDecoder(target, None, chat=False)
    want = engine.generate("the cat", max_new_tokens=60, json_schema=SCHEMA)
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    got = client.completions.create(model="tiny", prompt="the cat", max_tokens=60, temperature=0,
                                    extra_body={"response_format": fmt})
    assert got.choices[0].text == want.text and _valid("json_schema", got.choices[0].text)
    chunks = client.completions.create(model="tiny", prompt="the cat", max_tokens=60, temperature=0, stream=True,
                                       extra_body={"response_format": fmt})
    assert "".join(c.choices[0].text for c in chunks) == want.text
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a pet"}], max_tokens=60,
                                          temperature=0, response_format={"type": "json_object"})
    content = chat.choices[0].message.content  # any object: a random model may not close it within 60 tokens
    assert content.startswith("{") and (chat.choices[0].finish_reason == "length" or isinstance(json.loads(content), dict))
    regex = client.completions.create(model="tiny", prompt="a dog", max_tokens=40, temperature=0.7, seed=3,
                                      extra_body={"guided_regex": REGEX})
    assert _valid("regex", regex.choices[0].text)

    def error(body):
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "x", **body})
        return r.status_code, r.json()["error"]["param"]

    assert error({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}) == \
        (400, "response_format")
    assert error({"response_format": {"type": "xml"}}) == (400, "response_format")
    assert error({"guided_regex": "[a-"}) == (400, "guided_regex")
    assert error({"guided_regex": "a", "guided_json": SCHEMA}) == (400, "guided_regex")
    assert error({"guided_grammar": 7}) == (400, "guided_grammar")


GAP = "Ą"  # byte 0x04 as byte-level BPE writes it; SmolLM2's vocabulary has no token for it
UNFOLLOWABLE = "\x04\u00ca"  # a regex (a literal) whose first byte no token of such a vocabulary spells


@pytest.fixture(scope="module")
def gap_folder(tmp_path_factory):
    from tiny import write_tiny_bpe_folder

    return write_tiny_bpe_folder(tmp_path_factory.mktemp("gap") / "bpe", seed=0, missing=GAP)


def test_a_constraint_the_vocabulary_cannot_spell_is_a_one_line_error(gap_folder):
    """The fuzzer's 500 on smollm2-135m: a regex needing byte 0x04, which the vocabulary has no token for;
    llguidance's mask still allows a token, then refuses it. It ends the request with a ConstraintError, one line."""
    from specdec.errors import ConstraintError

    decoder = SpecDecoder(load_model(str(gap_folder), dtype="float32", backend="torch"), NgramDrafter(1, 3), chat=False)
    with pytest.raises(ConstraintError, match="cannot be followed with this model's tokenizer") as caught:
        decoder.generate("the cat", max_new_tokens=4, regex=UNFOLLOWABLE)
    assert "\n" not in str(caught.value)
    assert decoder.generate("the cat", max_new_tokens=3, ignore_eos=True).token_ids  # the decoder goes on
