"""The facts and ranked suggestions of one analysis, computed once and kept beside it.

The text report, the JSON report and the dashboard each ask for the same
analysis' facts and suggestions. They are kept here, not in the analysis (no
verb writes into a :class:`analyzer.api.RunAnalysis`), keyed by the analysis
object: an entry lives as long as its analysis. A RunAnalysis compares by
value and so is unhashable; the key is its ``id``, dropped by a weakref
finalizer when the analysis is collected (before the id can be reused). An
analysis copied with ``dataclasses.replace`` is another object, with its own
entry.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.verbs.suggest.engine import Suggestion
    from analyzer.verbs.suggest.facts import RunFacts


@dataclass
class SuggestMemo:
    """What suggest derived from one analysis; None until first asked."""

    facts: RunFacts | None = None
    suggestions: tuple[Suggestion, ...] | None = None


_MEMOS: dict[int, SuggestMemo] = {}
_LOCK = threading.Lock()  # the dashboard's sessions run in threads


def memo_of(ra: RunAnalysis) -> SuggestMemo:
    """The memo of this analysis object (empty on first use)."""
    key = id(ra)
    with _LOCK:
        memo = _MEMOS.get(key)
        if memo is None:
            memo = _MEMOS[key] = SuggestMemo()
            weakref.finalize(ra, _forget, key)
        return memo


def _forget(key: int) -> None:
    with _LOCK:
        _MEMOS.pop(key, None)
