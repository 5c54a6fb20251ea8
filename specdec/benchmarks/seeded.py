"""Hypothesis runs that draw the same examples in every process for a seed (the fuzzer's requests).

hypothesis' @seed fixes its random stream, but not everything a draw depends on: see `fixed_constants`.
"""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def fixed_constants():
    """Hypothesis (6.131 on) draws some values from the constants written in the source of the "local" modules a
    process has loaded, here specdec's own: which those are depends on what the process imported before (a
    pytest-xdist worker that ran other tests first, a bench run), so one seed wrote other requests in another
    process. Within this block hypothesis draws from its own fixed constants only; the requests depend on the
    document and the seed alone. (The patched function is hypothesis' internal one: tests/test_fuzz_server.py
    checks that two processes draw the same requests, and fails if a hypothesis release changes this.)"""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants

        original = providers._get_local_constants
    except (ImportError, AttributeError):  # a hypothesis without local constants
        yield
        return
    providers._get_local_constants = Constants
    providers.CONSTANTS_CACHE.cache.clear()  # pools computed with local constants, by earlier tests in this process
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


def run_seeded(strategy, count: int, seed: int, shrink: bool, test) -> None:
    """Calls test(example) on `count` examples of `strategy` drawn from `seed`, the same in every process; with
    shrink, a failure is shrunk to a smallest example, then raised."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    @hypothesis_seed(seed)
    @settings(max_examples=count, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=list(Phase) if shrink else [Phase.generate])
    @given(strategy)
    def run(example) -> None:
        test(example)

    with fixed_constants():
        run()
