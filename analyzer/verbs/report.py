"""The ``analyzer report`` document: :func:`report_json` (the versioned JSON report) and the
:func:`top_kernels_table` it and the renderers share. The text, Markdown and HTML reports are
drawn by :mod:`analyzer.render`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pandas as pd

from analyzer.ingest.formats import Generator, ReportDocument, package_version
from analyzer.jsontext import dumps_json  # noqa: F401 - part of this module's API

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


def report_json(a: "RunAnalysis") -> ReportDocument:
    """The versioned report: :meth:`RunAnalysis.to_json` plus the suggestions and a ``generator`` block."""
    from analyzer.verbs.suggest.run import report_suggestions  # docs/suggestions.md; loads every rule

    return ReportDocument(
        **a.to_json(),
        suggestions=report_suggestions(a),
        generator=Generator(
            tool="analyzer",
            version=package_version(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ),
    )


def top_kernels_table(a: "RunAnalysis", top: int) -> pd.DataFrame:
    """The ``top`` kernels (or host ops) over all ranks: name, kind, count, total_ms, ms per rank, share."""
    k = a.kernels
    if k is None or k.empty:
        return pd.DataFrame(columns=["name", "kind", "count", "total_ms", "ms_per_rank", "share_pct"])
    n_ranks = max(1, k["rank"].nunique())
    frame = k.assign(name=k["name"].astype(str))
    grouped = frame.groupby("name", sort=False).agg(
        kind=("kind", "first"), count=("count", "sum"), total_ms=("total_ms", "sum"), share_pct=("share_pct", "mean")
    )
    grouped["ms_per_rank"] = grouped["total_ms"] / n_ranks
    grouped = grouped.reset_index().sort_values(["total_ms", "name"], ascending=[False, True], kind="stable")
    return grouped.head(top)[["name", "kind", "count", "total_ms", "ms_per_rank", "share_pct"]].reset_index(drop=True)
