"""``check --min-goodput``: the candidate's goodput against a floor."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TypedDict, cast

from analyzer.errors import AnalyzerError

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


class GoodputDocument(TypedDict):
    """The check document's ``goodput``: :class:`GoodputGate`'s fields and ``failed``."""

    min_goodput: float
    goodput: float
    wall_s: float
    productive_s: float
    lost_s: dict[str, float]
    attempts: int
    base_goodput: float | None
    failed: bool


@dataclass(frozen=True)
class GoodputGate:
    """``check --min-goodput G``: the candidate's goodput against a floor (docs/ci.md "Goodput").

    Goodput is one number per run (productive step time / wall time,
    :mod:`analyzer.metrics.goodput`), not a sample per step, so there is no
    test statistic: the gate fails iff ``goodput < min_goodput``. The
    first baseline's goodput is kept beside it for context only.
    """

    min_goodput: float
    goodput: float
    wall_s: float
    productive_s: float
    lost_s: dict[str, float]
    attempts: int
    base_goodput: float | None = None

    @property
    def failed(self) -> bool:
        return not self.goodput >= self.min_goodput  # a NaN goodput (zero wall time) fails too

    def lost_text(self, top: int = 3) -> str:
        """The largest losses, e.g. ``restarts 12.3 s, recomputed 4.0 s``."""
        parts = sorted(((v, k) for k, v in self.lost_s.items() if v > 0.005), reverse=True)[:top]
        return ", ".join(f"{k} {v:.2f} s" for v, k in parts) or "none"

    def text(self) -> str:
        base = f"; baseline {self.base_goodput:.1%}" if self.base_goodput is not None else ""
        state = "below the floor" if self.failed else "at or above the floor"
        return (
            f"goodput {self.goodput:.1%} ({state} {self.min_goodput:.1%}; productive {self.productive_s:.2f} s "
            f"of wall {self.wall_s:.2f} s, {self.attempts} attempt(s){base}); largest losses: {self.lost_text()}"
        )

    def to_json(self) -> GoodputDocument:
        return cast(GoodputDocument, asdict(self) | {"failed": self.failed})


def goodput_gate(candidate: "RunAnalysis", min_goodput: float, baseline: "RunAnalysis | None" = None) -> GoodputGate:
    """The goodput floor on the candidate; AnalyzerError (exit 2) when its goodput is withheld."""
    if not 0.0 <= min_goodput <= 1.0:
        raise AnalyzerError(f"--min-goodput must be between 0 and 1, got {min_goodput}")
    gp = candidate.goodput()
    if gp is None:
        raise AnalyzerError(
            f"--min-goodput: {candidate.path}: no goodput (it needs a reftrain run directory with run.json start "
            "times and per-step records; a folder of traces has neither)"
        )
    base = baseline.goodput() if baseline is not None else None
    return GoodputGate(
        min_goodput=min_goodput,
        goodput=gp.goodput,
        wall_s=gp.wall_s,
        productive_s=gp.productive_s,
        lost_s=dict(gp.lost_s),
        attempts=gp.attempts,
        base_goodput=None if base is None else base.goodput,
    )
