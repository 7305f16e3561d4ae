"""Shared fixtures: paths to the repository and to ../shared/ (optional), and
the one flag that regenerates the checked-in expected outputs.

``pytest --update-goldens`` rewrites the golden report JSON under
``tests/golden/`` (tests/test_golden_reports.py) and the public-surface
snapshot (tests/test_public_surface.py) from the current code, instead of
comparing against them; review the diff and commit it with the change that
made it (docs/architecture.md, "Golden files").
"""

from __future__ import annotations

import signal
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


_GUARDED_SIGNALS = tuple(s for s in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2") if hasattr(signal, s))


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Fail a test that leaves a signal handler installed in the pytest process.

    A leaked Python SIGTERM handler is inherited by every process the suite
    forks later, which then survive ``terminate()`` while blocked in a write:
    the analyzer's parse pool waited forever on such a worker in CI.
    """
    before = {name: signal.getsignal(getattr(signal, name)) for name in _GUARDED_SIGNALS}
    yield
    leaked = [name for name in _GUARDED_SIGNALS if signal.getsignal(getattr(signal, name)) is not before[name]]
    for name in leaked:
        signal.signal(getattr(signal, name), before[name])
    assert not leaked, f"the test left its own handler for {', '.join(leaked)} installed (restored now)"
