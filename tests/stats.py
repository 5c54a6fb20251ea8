"""A goodness-of-fit check: empirical counts against an exact distribution."""
from __future__ import annotations

import numpy as np
from scipy import stats

P_VALUE_FLOOR = 1e-3  # a correct sampler fails a given fixed-seed check with probability 1e-3


def fit_p_value(counts: dict, exact: dict) -> float:
    """Pearson chi-square p-value; outcomes with expected count < 5 are pooled into one bin."""
    n = sum(counts.values())
    assert set(counts) <= {k for k, v in exact.items() if v > 0}, "sampled an outcome of probability zero"
    observed, expected, pooled_o, pooled_e = [], [], 0.0, 0.0
    for outcome, prob in exact.items():
        e = prob * n
        if e < 5:
            pooled_o += counts.get(outcome, 0)
            pooled_e += e
        else:
            observed.append(counts.get(outcome, 0))
            expected.append(e)
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    observed, expected = np.array(observed, float), np.array(expected, float)
    expected *= observed.sum() / expected.sum()
    return float(stats.chisquare(observed, expected).pvalue)
