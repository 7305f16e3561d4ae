"""Shared fixtures: paths to the repository and to ../shared/ (optional), and
the one flag that regenerates the checked-in expected outputs.

``pytest --update-goldens`` rewrites the golden report JSON under
``tests/golden/`` (tests/test_golden_reports.py) and the public-surface
snapshot (tests/test_public_surface.py) from the current code, instead of
comparing against them; review the diff and commit it with the change that
made it (docs/architecture.md, "Golden files").
"""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces" / "hta-samples"
GOLDEN = Path(__file__).resolve().parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite tests/golden/ (golden reports, public-surface snapshot) from the current code instead of comparing",
    )


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True under ``pytest --update-goldens``: write the expected files instead of comparing."""
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture
def hta_samples() -> Path:
    """../shared/traces/hta-samples, or skip: users' clones do not have it."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real HTA sample traces not found at {SHARED_TRACES} (only in the project's CI and dev machines)")
    return SHARED_TRACES
