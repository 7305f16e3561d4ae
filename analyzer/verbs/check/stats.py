"""The gate's statistics on higher-is-better per-step values: the quantile compared, the relative drop,
the one-sided Mann-Whitney U test and the runs' own noise (definitions: the package docstring)."""

from __future__ import annotations

import math
from itertools import combinations
from typing import Sequence

import numpy as np

# Each half of a run needs this many steps for its quantile to mean anything.
_MIN_HALF = 4


def min_one_sided_p(n_base: int, n_cand: int) -> float:
    """Smallest p-value the exact one-sided Mann-Whitney U test can reach.

    It is reached when every candidate value is below every baseline value:
    one ordering out of ``C(n_base + n_cand, n_cand)`` equally likely ones.
    ``scipy.special.comb`` in floating point: ``1 / math.comb`` overflows
    ``float()`` from about 1030 + 1030 steps.
    """
    from scipy.special import comb

    return float(1.0 / comb(n_base + n_cand, n_cand, exact=False))


def mann_whitney_less(base: np.ndarray, cand: np.ndarray) -> float:
    """One-sided p-value of H1 "cand is stochastically smaller than base".

    scipy picks the exact distribution for small samples without ties and
    the tie-corrected normal approximation otherwise. When every value is
    identical the statistic has zero variance and scipy returns NaN: there
    is no evidence of a difference, so the p-value is 1.
    """
    from scipy import stats  # here, not at module level: `analyzer report` never needs scipy

    result = stats.mannwhitneyu(cand, base, alternative="less", method="auto")
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else p


def relative_drop(base_value: float, cand_value: float) -> float:
    """``(base - cand) / base``; 0.1 means the candidate is 10% lower."""
    return (base_value - cand_value) / base_value


def fast_quantile(values: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of step time for higher-is-better ``values``: their ``1 - quantile`` quantile.

    Read off the empirical distribution (numpy's ``averaged_inverted_cdf``),
    so pooling runs with identical ones leaves it where it was (numpy's
    default linear interpolation moves with the sample's size: two copies
    of a run pooled read 5 % off the run itself); a constant shift or scale
    of every value moves it exactly as much.
    """
    return float(np.quantile(values, 1.0 - quantile, method="averaged_inverted_cdf"))


def self_noise(runs: Sequence[tuple[str, np.ndarray]], quantile: float) -> tuple[float, str]:
    """How far the runs' statistic moves against themselves; see the package docstring (:mod:`analyzer.verbs.check`).

    ``runs`` are ``(label, values in step order)``. Returns the largest
    ``|relative drop|`` among: first half vs second half of each run with at
    least ``2 * _MIN_HALF`` steps, and every pair of runs labelled
    ``baseline...``; and a text naming where it came from. 0.0 with
    ``"no run long enough to split"`` when nothing could be measured.
    """
    found: list[tuple[float, str]] = []
    for label, values in runs:
        if len(values) >= 2 * _MIN_HALF:
            half = len(values) // 2
            first, second = fast_quantile(values[:half], quantile), fast_quantile(values[half:], quantile)
            found.append((abs(relative_drop(first, second)), f"{label}: first half vs second half"))
    bases = [(label, fast_quantile(v, quantile)) for label, v in runs if label.startswith("baseline")]
    for (la, qa), (lb, qb) in combinations(bases, 2):
        found.append((abs(relative_drop(qa, qb)), f"{la} vs {lb}"))
    if not found:
        return 0.0, "no run long enough to split"
    return max(found, key=lambda t: t[0])
