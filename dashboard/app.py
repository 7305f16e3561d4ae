"""The dashboard's Streamlit entry point (served by the `dashboard` CLI).

Pages live in ``dashboard/views/`` (not ``pages/``: a ``pages/`` folder next
to the entry script switches Streamlit to its older automatic multipage mode,
which would fight ``st.navigation``). Every page presents analyzer results;
none computes a metric.
"""

from __future__ import annotations

import streamlit as st

from dashboard import state
from dashboard.text import plain

st.set_page_config(page_title="trainperf dashboard", layout="wide")

runs = state.all_runs()
state.sidebar_run_selector(runs)

navigation = st.navigation(
    {
        "Runs": [
            st.Page("views/runs.py", title="Runs", default=True),
            st.Page("views/history.py", title="History", url_path="history"),
        ],
        "Selected run": [
            st.Page("views/overview.py", title="Overview", url_path="overview"),
            st.Page("views/timeline.py", title="Timeline", url_path="timeline"),
            st.Page("views/operators.py", title="Operators", url_path="operators"),
            st.Page("views/modules.py", title="Modules", url_path="modules"),
            st.Page("views/communication.py", title="Communication", url_path="communication"),
            st.Page("views/stragglers.py", title="Stragglers", url_path="stragglers"),
            st.Page("views/telemetry.py", title="Telemetry", url_path="telemetry"),
            st.Page("views/compare.py", title="Compare", url_path="compare"),
        ],
    }
)
st.sidebar.caption(f"Runs folder: {plain(str(state.runs_root()))}")
navigation.run()
