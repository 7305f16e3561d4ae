"""Which runs exist and which one is selected, for every page.

The selected run lives in the URL (``?run=NAME``) so that a link opens a run
page, and in session state so that it survives page switches (Streamlit's
navigation drops query parameters when the user clicks another page).
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from dashboard.cli import RUNS_DIR_ENV
from dashboard.discover import RunEntry, RunLookupError, discover_runs, resolve_run
from dashboard.text import plain

RUN_PARAM = "run"
BASE_PARAM = "base"
RUN_KEY = "selected_run"


def runs_root() -> Path:
    """RUNS_DIR as given to the CLI (env ``DASHBOARD_RUNS_DIR``), default ``runs``."""
    return Path(os.environ.get(RUNS_DIR_ENV, "runs")).resolve()


def all_runs() -> list[RunEntry]:
    """The runs below RUNS_DIR, discovered afresh (a scandir, cheap) on each rerun."""
    return discover_runs(runs_root())


def _on_select() -> None:
    st.query_params[RUN_PARAM] = st.session_state[RUN_KEY]


def sidebar_run_selector(runs: list[RunEntry]) -> None:
    """A run picker in the sidebar, kept in sync with ``?run=``.

    A name in the URL wins when it names a run (someone opened a link); a
    name that is not a run is reported on the page by :func:`selected_run`
    and nothing is read for it.
    """
    names = [r.name for r in runs]
    wanted = st.query_params.get(RUN_PARAM)
    if wanted is not None and wanted in names:
        st.session_state[RUN_KEY] = wanted
    elif st.session_state.get(RUN_KEY) not in names:
        st.session_state.pop(RUN_KEY, None)
    if not names:
        st.sidebar.caption("No runs found.")
        return
    st.sidebar.selectbox("Run", names, key=RUN_KEY, index=None, placeholder="choose a run", on_change=_on_select)
    if wanted is None and st.session_state.get(RUN_KEY) is not None:
        st.query_params[RUN_PARAM] = st.session_state[RUN_KEY]


def selected_run(runs: list[RunEntry]) -> RunEntry | None:
    """The run the URL or the sidebar names, or None after saying why on the page."""
    name = st.query_params.get(RUN_PARAM) or st.session_state.get(RUN_KEY)
    if not name:
        st.info("Choose a run in the sidebar, or open one from the Runs page.")
        return None
    try:
        return resolve_run(runs, runs_root(), name)
    except RunLookupError as exc:
        st.error(plain(str(exc)))
        return None


def param_run(runs: list[RunEntry], param: str) -> RunEntry | None:
    """The run named by query parameter `param`, or None (with a message if refused)."""
    name = st.query_params.get(param)
    if not name:
        return None
    try:
        return resolve_run(runs, runs_root(), name)
    except RunLookupError as exc:
        st.error(plain(str(exc)))
        return None
