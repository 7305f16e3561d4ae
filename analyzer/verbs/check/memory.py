"""``check --max-memory-growth``: the candidate's peak memory against the baselines'."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence, TypedDict, cast

from analyzer.errors import AnalyzerError

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


class MemoryDocument(TypedDict):
    """The check document's ``memory``: :class:`MemoryGate`'s fields and ``failed``."""

    max_growth: float
    growth: float
    base_bytes: float
    cand_bytes: float
    kind: str
    source: str
    reserved_growth: float | None
    failed: bool


@dataclass(frozen=True)
class MemoryGate:
    """``check --max-memory-growth FRAC``: the candidate's peak memory against the baselines' (docs/ci.md "Memory").

    Peak memory is one number per run (``RunAnalysis.memory``: the max over
    ranks of each rank's peak allocated bytes, or resident set on CPU;
    docs/metrics.md "Memory"), nearly deterministic on a GPU, so there is no
    test statistic: the gate fails iff ``growth = (cand - base) / base``
    exceeds ``max_growth``, ``base`` being the largest of the baselines'
    peaks (several baselines: the candidate must outgrow all of them).
    ``reserved_growth``: the same on peak reserved bytes, for context.
    """

    max_growth: float
    growth: float
    base_bytes: float
    cand_bytes: float
    kind: str
    source: str
    reserved_growth: float | None = None

    @property
    def failed(self) -> bool:
        return self.growth > self.max_growth

    def text(self) -> str:
        what = "resident set" if self.kind == "cpu_rss" else "allocated"
        state = "over" if self.failed else "within"
        reserved = f"; reserved {self.reserved_growth:+.1%}" if self.reserved_growth is not None else ""
        return (
            f"peak memory {self.base_bytes / 2**20:,.1f} -> {self.cand_bytes / 2**20:,.1f} MiB {what} "
            f"({self.growth:+.1%}, {state} the allowed {self.max_growth:+.1%}{reserved}; {self.source} {self.kind}, "
            "max over ranks)"
        )

    def to_json(self) -> MemoryDocument:
        return cast(MemoryDocument, asdict(self) | {"failed": self.failed})


def memory_gate(bases: "Sequence[RunAnalysis]", candidate: "RunAnalysis", max_growth: float) -> MemoryGate:
    """The peak-memory gate (:class:`MemoryGate`); AnalyzerError (exit 2) when a run has no peak memory or
    the runs' figures are not of the same kind (GPU allocated against CPU resident set, records against traces)."""
    if not max_growth >= 0.0:
        raise AnalyzerError(f"--max-memory-growth must be >= 0 (a fraction: 0.05 allows +5%), got {max_growth}")
    runs = [("candidate", candidate)] + [
        ("baseline" if len(bases) == 1 else f"baseline {i + 1}", b) for i, b in enumerate(bases)
    ]
    for label, a in runs:
        if not a.memory.peak_allocated_bytes:
            raise AnalyzerError(
                f"--max-memory-growth: the {label} ({a.path}) has no peak memory (needs metrics records "
                "with mem_bytes, or traces taken with profile_memory=True)"
            )
    kinds = {(a.memory.source, a.memory.kind) for _, a in runs}
    if len(kinds) > 1:
        raise AnalyzerError(
            "--max-memory-growth: the runs' peak memory figures differ in kind ("
            + "; ".join(f"{label}: {a.memory.source} {a.memory.kind}" for label, a in runs)
            + "); they cannot be compared"
        )
    base = max(float(b.memory.peak_allocated_bytes or 0.0) for b in bases)
    cand = float(candidate.memory.peak_allocated_bytes or 0.0)
    reserved = [b.memory.peak_reserved_bytes for b in bases]
    rc = candidate.memory.peak_reserved_bytes
    known = [r for r in reserved if r]
    rb = max(known) if len(known) == len(reserved) else None
    return MemoryGate(
        max_growth=max_growth,
        growth=(cand - base) / base,
        base_bytes=base,
        cand_bytes=cand,
        kind=str(candidate.memory.kind),
        source=str(candidate.memory.source),
        reserved_growth=(rc - rb) / rb if rb and rc is not None else None,
    )
