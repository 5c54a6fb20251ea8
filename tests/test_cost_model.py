"""The cost model the draft-length policy reads: a verify-cost curve interpolated and extrapolated from measured
passes that never falls as passes grow, a new size starting from the curve, each kind of drafter's own drafting cost
over the one curve, and drafting costs measured warm (after warm_up), not taken from a cold first call."""
from hypothesis import given, strategies as st

from cost_curves import flat_costs
from specdec.costs import time_by_size


def test_cost_model_interpolates_and_extrapolates():
    costs = flat_costs()
    assert costs.verify_s(8) == 0.024
    assert abs(costs.verify_s(12) - 0.027) < 1e-12
    assert costs.verify_s(64) > costs.verify_s(32)
    costs.observe_verify(8, 0.034, weight=0.5)
    assert abs(costs.verify_s(8) - 0.029) < 1e-12


def test_the_cost_curve_never_falls_as_passes_grow():
    """A slow spell at one size pools with the sizes above it instead of making them look cheaper."""
    costs = flat_costs()
    costs.observe_verify(4, 0.040, weight=1.0)  # above what 8 and 16 tokens cost
    curve = [costs.verify_s(T) for T in range(1, 40)]
    assert all(a <= b for a, b in zip(curve, curve[1:]))
    assert abs(costs.verify_s(4) - (0.040 + 0.024 + 0.030) / 3) < 1e-12
    assert costs.table[4] == 0.040  # the measurements themselves are kept


def test_a_new_size_starts_from_the_curve_not_from_one_pass():
    costs = flat_costs()
    costs.observe_verify(5, 0.5)  # one pass, 20 times what the curve says, at a size not timed before
    assert abs(costs.table[5] - (0.1 * 0.5 + 0.9 * 0.0225)) < 1e-12  # 0.0225: the curve's value at 5
    assert costs.verify_s(5) < 0.1 * 0.5 + 0.9 * 0.0225 + 1e-12


def test_each_kind_of_drafter_keeps_its_own_drafting_cost_over_one_verify_curve():
    costs = flat_costs()
    eagle, ngram = costs.for_drafter("eagle"), costs.for_drafter("ngram")
    assert costs.for_drafter("eagle") is eagle
    eagle.observe_draft(4, 0.02)
    assert eagle.draft_s(1) == 0.005 and ngram.draft_s(1) == 0.0
    ngram.observe_verify(8, 0.026, weight=1.0)
    assert eagle.verify_s(8) == costs.verify_s(8) == 0.026


def test_warm_up_replaces_a_cold_drafting_cost(tiny_folder):
    from specdec.drafters.lookup.ngram import NgramDrafter
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model

    costs = flat_costs()
    costs.for_drafter("ngram").observe_draft(1, 20.0)
    decoder = SpecDecoder(load_model(str(tiny_folder), dtype="float32"), NgramDrafter(1, 3), costs=costs)
    decoder.warm_up()
    assert 0 < costs.for_drafter("ngram").draft_per_token_s < 0.1


def test_a_drafter_built_by_name_after_warm_up_is_warmed_up_too(tiny_folder):
    """A request naming another drafter than the decoder's (a server's `speculation.drafter`) gets one whose
    drafting cost was measured warm, not taken from its cold first call; a decoder never warmed up leaves it."""
    from specdec.drafters.lookup.suffix import SuffixDrafter
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model

    target = load_model(str(tiny_folder), dtype="float32")
    for warm in (True, False):
        costs = flat_costs()
        decoder = SpecDecoder(target, SuffixDrafter(), costs=costs)
        if warm:
            decoder.warm_up()
        costs.for_drafter("ngram").observe_draft(1, 20.0)  # as a cold first call would
        assert decoder.drafter_named("ngram", min_n=1, max_n=3).name == "ngram"
        assert (0 < costs.for_drafter("ngram").draft_per_token_s < 0.1) == warm


@given(own=st.lists(st.integers(1, 50), min_size=1, max_size=4), spell_start=st.integers(0, 30),
       spell_length=st.integers(0, 4), slowdown=st.integers(2, 9))
def test_pass_timing_gives_each_size_its_own_cost_through_a_slow_spell(own, spell_start, spell_length, slowdown):
    """A fake clock: each call costs its size's own time, a process's first call at a size twice that, and the calls
    during a slow spell `slowdown` times that. The sizes take turns, so a spell shorter than a round leaves every size
    a call at its own cost (4 timed rounds after an untimed one, the first timed one dropped)."""
    sizes = list(range(1, len(own) + 1))
    now, calls, seen = [0.0], [0], set()

    def run(size):
        cost = own[size - 1] * (2 if size not in seen else 1)
        seen.add(size)
        if spell_start <= calls[0] < spell_start + min(spell_length, len(sizes) - 1):
            cost *= slowdown
        calls[0] += 1
        now[0] += cost

    measured = time_by_size(run, lambda size: None, sizes, repeats=3, clock=lambda: now[0])
    assert measured == {size: own[size - 1] for size in sizes}


def test_passes_over_several_sequences_are_kept_apart_from_one_sequences_curve():
    """A batch's passes move the costs of passes over that many sequences only: one sequence's curve (and a batch of
    another size, until its own passes are seen) reads as before."""
    costs = flat_costs()
    for _ in range(40):
        costs.observe_verify(16, 0.060, sequences=16)  # 16 sequences, a token each: twice one sequence's 16 tokens
    assert costs.verify_s(16) == 0.030 and costs.table == flat_costs().table
    assert abs(costs.verify_s(16, sequences=16) - 0.060) < 1e-3
    assert costs.verify_s(16, sequences=4) == 0.030  # no pass over 4 sequences seen: one sequence's curve


def test_a_batch_past_the_sizes_seen_adds_what_one_sequences_curve_adds():
    """Drafted rows past the batch sizes seen cost the seen pass plus the one-sequence curve's rise between the two
    sizes (the extra rows' products), not the one-sequence curve's own level; between seen sizes, interpolated, and
    never less as the pass grows."""
    costs = flat_costs()
    costs.observe_verify(16, 0.060, weight=1.0, sequences=16)
    assert abs(costs.verify_s(32, sequences=16) - (0.060 + 0.045 - 0.030)) < 1e-12
    costs.observe_verify(24, 0.070, weight=1.0, sequences=16)
    assert abs(costs.verify_s(20, sequences=16) - 0.065) < 1e-12
    costs.observe_verify(20, 0.050, weight=1.0, sequences=16)  # a fast spell below the 16-token pass pools with it
    curve = [costs.verify_s(T, sequences=16) for T in range(16, 40)]
    assert all(a <= b for a, b in zip(curve, curve[1:]))
    views = costs.for_drafter("ngram")
    assert views.verify_s(20, sequences=16) == costs.verify_s(20, sequences=16)  # one set of tables for every view


@given(st.lists(st.tuples(st.integers(2, 8), st.integers(0, 12), st.floats(0.001, 1.0)), max_size=30))
def test_a_batch_cost_never_falls_as_its_pass_grows(passes):
    """Whatever passes were seen, for every batch size a pass over more tokens is estimated to cost no less."""
    costs = flat_costs()
    for sequences, extra, seconds in passes:
        costs.observe_verify(sequences + extra, seconds, sequences=sequences)
    for sequences in range(2, 9):
        curve = [costs.verify_s(T, sequences) for T in range(sequences, sequences + 40)]
        assert all(0 < a <= b for a, b in zip(curve, curve[1:]))
