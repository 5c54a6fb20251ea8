"""Verify-cost curves for tests of the cost model and the draft-length policy."""
from specdec.costs import CostModel


def flat_costs() -> CostModel:
    """A memory-bound verify pass: 20 ms for one token, barely more for 16 (seconds a pass by tokens in it)."""
    return CostModel({1: 0.020, 2: 0.021, 4: 0.022, 8: 0.024, 16: 0.030, 32: 0.045})
