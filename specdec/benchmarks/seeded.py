"""Hypothesis runs that draw the same examples for a seed (the fuzzer's requests).

hypothesis' @seed fixes its random stream. It also draws, now and then, constants it finds in the source of the
"local" modules the process has loaded (not the standard library's, not site-packages', not tests'): an installed
specdec is none of those, so a seed draws the same requests in every process. Run from a source checkout, specdec's
own modules are local, and the draws may depend on which of them the process imported first; the fuzz journal then
refuses to resume another process's run rather than mix them (fuzz_journal.py), and the tests pin hypothesis'
constants themselves (tests/hypothesis_constants.py).
"""

from __future__ import annotations


def run_seeded(strategy, count: int, seed: int, shrink: bool, test) -> None:
    """Calls test(example) on `count` examples of `strategy` drawn from `seed`; with shrink, a failure is shrunk to a
    smallest example, then raised."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=list(Phase) if shrink else [Phase.generate],
    )
    @given(strategy)
    def run(example) -> None:
        test(example)

    run()
