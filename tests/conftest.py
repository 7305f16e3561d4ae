"""Shared fixtures: paths to the repository and to ../shared/ (optional)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces" / "hta-samples"


@pytest.fixture
def hta_samples() -> Path:
    """../shared/traces/hta-samples, or skip: users' clones do not have it."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real HTA sample traces not found at {SHARED_TRACES} (only in the project's CI and dev machines)")
    return SHARED_TRACES
