"""The step-statistic gate's knobs and result: :class:`CheckConfig`, :class:`CheckResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, TypedDict, cast

from analyzer.errors import AnalyzerError
from analyzer.verbs.check.samples import METRIC_LABELS, Metric

Verdict = Literal["pass", "regression", "inconclusive"]
# The word ``analyzer check`` prints for each verdict (the step statistic's and the overall one alike).
VERDICT_LABELS: dict[str, str] = {
    "pass": "PASS",
    "regression": "REGRESSION",
    "inconclusive": "INCONCLUSIVE (too noisy)",
}


@dataclass(frozen=True)
class CheckConfig:
    """Knobs of the gate (CLI: ``--max-mfu-drop``, ``--alpha``, ``--quantile``)."""

    max_drop: float = 0.05  # relative drop of the statistic allowed (0.05 = 5%)
    alpha: float = 0.05  # significance level of the one-sided Mann-Whitney U test
    quantile: float = 0.25  # quantile of step time compared (0.5 = median; lower = faster steps)

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_drop < 1.0:
            raise AnalyzerError(f"--max-mfu-drop must be in [0, 1), got {self.max_drop}")
        if not 0.0 < self.alpha < 1.0:
            raise AnalyzerError(f"--alpha must be in (0, 1), got {self.alpha}")
        if not 0.0 < self.quantile < 1.0:
            raise AnalyzerError(f"--quantile must be in (0, 1), got {self.quantile}")


class CheckStatisticDocument(TypedDict):
    """One gated statistic in the check document (the CPU-time one: its ``cpu_time``): the fields of
    :class:`CheckResult` but the sources, and ``metric_label``. Definitions: docs/ci.md."""

    verdict: Verdict
    metric: Metric
    base_median: float
    cand_median: float
    base_value: float
    cand_value: float
    quantile: float
    drop: float
    max_drop: float
    p_value: float
    alpha: float
    noise: float
    noise_source: str
    min_detectable_drop: float
    n_base: int
    n_cand: int
    n_baselines: int
    exceeds_threshold: bool
    significant: bool
    notes: list[str]
    metric_label: str


class CheckResultDocument(CheckStatisticDocument):
    """:meth:`CheckResult.to_json`: every field of :class:`CheckResult`, ``schema`` and ``metric_label``."""

    base_source: str
    cand_source: str
    schema: str  # CHECK_SCHEMA


CHECK_SCHEMA = "analyzer.check/2"


@dataclass(frozen=True)
class CheckResult:
    """Outcome of the gate; JSON-serializable through :meth:`to_json`."""

    verdict: Verdict
    metric: Metric
    base_median: float  # pooled baselines
    cand_median: float
    base_value: float  # the statistic: the (1 - quantile) quantile of the values
    cand_value: float
    quantile: float  # of step time
    drop: float  # relative, (base - cand) / base of the statistic
    max_drop: float
    p_value: float  # one-sided Mann-Whitney U, H1: cand < base
    alpha: float
    noise: float  # largest |drop| of the runs against themselves (split halves, baselines pairwise)
    noise_source: str  # which comparison gave it
    min_detectable_drop: float  # max(max_drop, noise)
    n_base: int  # steps, all baselines
    n_cand: int
    n_baselines: int
    exceeds_threshold: bool
    significant: bool
    base_source: str
    cand_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def regression(self) -> bool:
        return self.verdict == "regression"

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"

    @property
    def verdict_label(self) -> str:
        """The word ``analyzer check`` prints: PASS, REGRESSION or INCONCLUSIVE (too noisy)."""
        return VERDICT_LABELS[self.verdict]

    @property
    def metric_label(self) -> str:
        return METRIC_LABELS[self.metric]

    @property
    def statistic_label(self) -> str:
        """E.g. ``MFU at the 25th percentile of step time``."""
        if self.quantile == 0.5:
            return f"median {self.metric_label}"
        return f"{self.metric_label} at the {_ordinal(self.quantile)} percentile of step time"

    def to_json(self) -> CheckResultDocument:
        # The fields in their order, then the two added keys (tests/test_documents.py holds the type to them).
        out = cast(CheckResultDocument, asdict(self))
        out["schema"] = CHECK_SCHEMA
        out["metric_label"] = self.metric_label
        return out


def _ordinal(q: float) -> str:
    n = round(100 * q, 1)
    text = f"{n:g}"
    suffix = (
        "th" if 10 <= n % 100 < 20 or not float(n).is_integer() else {1: "st", 2: "nd", 3: "rd"}.get(int(n) % 10, "th")
    )
    return text + suffix
