"""Per-call speculation in the Python API: generate/stream(drafter=..., speculation=...), as a server request's
`speculation` object chooses it. The output is the target's whatever the choice."""
import pytest

from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.models.loading import load_model

PROMPT = "the dog ran to the dog ran to the"


@pytest.fixture(scope="module")
def target(tiny_folder):
    return load_model(str(tiny_folder), dtype="float32")


def run(decoder, **choice):
    return decoder.generate(PROMPT, max_new_tokens=30, ignore_eos=True, **choice)


def test_a_call_may_switch_drafting_off_or_bound_it(target):
    decoder = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(8, adaptive=False))
    default, off, none = run(decoder), run(decoder, speculation=False), run(decoder, drafter="none")
    assert len(default.metrics.drafted_per_position) > 2  # up to 8 drafts a step
    assert off.metrics.drafted_tokens == none.metrics.drafted_tokens == 0
    two = run(decoder, speculation=SpeculationConfig(2, adaptive=False))
    assert two.metrics.drafted_tokens > 0 and len(two.metrics.drafted_per_position) <= 2
    assert default.token_ids == off.token_ids == none.token_ids == two.token_ids
    assert run(decoder).metrics.drafted_per_position == default.metrics.drafted_per_position  # the default is kept


def test_a_call_may_pick_another_drafter_by_name(target, monkeypatch):
    plain = SpecDecoder(target, None)  # loaded without a drafter: its costs were never measured
    assert not plain.costs.measured
    baseline = run(plain)
    suffix = plain.drafter_named("suffix")
    assert plain.drafter_named("suffix") is suffix  # built once
    calls = []
    monkeypatch.setattr(suffix, "propose", lambda *a, _p=suffix.propose: calls.append(1) or _p(*a))
    first = run(plain, drafter="suffix")
    assert plain.costs.measured  # the adaptive policy decides from the target's measured costs
    # drafting at every step (whether the adaptive policy drafts depends on the timings, on a loaded machine too)
    again = run(plain, drafter="suffix", speculation=SpeculationConfig(8, adaptive=False))
    assert calls and again.metrics.accepted_tokens > 0  # drafted from the first answer, which the suffix index keeps
    assert first.token_ids == again.token_ids == baseline.token_ids
    assert plain.drafter is None and run(plain).metrics.drafted_tokens == 0  # the decoder's own choice is kept


def test_bad_choices_are_refused(target):
    decoder = SpecDecoder(target, None)
    with pytest.raises(ConfigError, match="speculation must be"):
        run(decoder, speculation=4)
    with pytest.raises(ConfigError, match="unknown drafter|drafter"):
        run(decoder, drafter="no-such-drafter")
