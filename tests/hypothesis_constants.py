"""Pins hypothesis' draws to its own constants for the fuzz tests (specdec/benchmarks/seeded.py says why).

Hypothesis (6.131 on) draws some values from the constants written in the source of the "local" modules a process
has loaded. The tests run specdec from its source tree, whose modules are local, and which of them a pytest-xdist
worker has imported depends on the tests it ran before: one seed drew other requests in another process. Within
`fixed_constants` hypothesis draws from its own fixed constants only. The patched function is hypothesis' internal
one, which is why this lives with the tests and not in the package: tests/test_fuzz_server.py checks that two
processes draw the same requests, and fails if a hypothesis release changes this.
"""
from contextlib import contextmanager


@contextmanager
def fixed_constants():
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
