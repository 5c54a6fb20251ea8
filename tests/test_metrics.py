"""GenerationMetrics: MAT over all verify steps, the mean acceptance length over drafting steps only."""
from specdec.metrics import GenerationMetrics
from specdec.request import count_step_metrics


def test_mean_acceptance_length_leaves_out_plain_steps():
    a, b = GenerationMetrics(), GenerationMetrics()
    count_step_metrics(a, drafted=4, accepted=3, emitted=4)
    count_step_metrics(a, drafted=0, accepted=0, emitted=1)  # the adaptive policy drafted nothing
    count_step_metrics(b, drafted=2, accepted=0, emitted=1)
    count_step_metrics(b, drafted=0, accepted=0, emitted=1)
    total = a.merge(b)
    assert (total.steps, total.drafting_steps) == (4, 2)
    assert total.mean_accepted_tokens == 7 / 4  # all verify steps
    assert total.mean_acceptance_length == 1 + 3 / 2  # vLLM's: drafting steps only
    d = total.to_dict()
    assert d["drafting_steps"] == 2 and d["mean_acceptance_length"] == 2.5
    assert "MAT 1.75 (2.50 over 2 drafting steps)" in total.summary()


def test_no_drafting_step_has_no_acceptance_length():
    m = GenerationMetrics()
    count_step_metrics(m, drafted=0, accepted=0, emitted=1)
    assert m.mean_accepted_tokens == 1.0 and m.mean_acceptance_length is None
    assert "drafting steps" not in m.summary()
