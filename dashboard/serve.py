"""The dashboard's server process: Streamlit, with the analyzer imported first.

``dashboard`` (dashboard/cli.py) execs ``python -m dashboard.serve run
app.py ...``, which is ``python -m streamlit run app.py ...`` plus imports.
Streamlit imports an app's modules on the app's first script run, that is
while the first browser waits: pandas, numpy and the analyzer took about
1 s of a 1.6 s first run (and of a 5 s cold page) on the 2-core
development machine. Importing them here, before the server listens, moves
that cost into the server start; the page's first run then only analyzes
the run (docs/dashboard.md, "Performance").

Only modules without Streamlit state are imported here (the analyzer,
pandas, numpy); the dashboard's own modules, whose cached functions belong
to the Streamlit runtime, are imported by the app as usual.
"""

from __future__ import annotations


def preload() -> None:
    """Import what every run page needs."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    import analyzer.api
    import analyzer.verbs.suggest.engine
    import analyzer.metrics.throughput  # noqa: F401


def main() -> None:
    preload()
    from streamlit.web.cli import main as streamlit_main

    # The same program name `python -m streamlit` uses, so Streamlit sees
    # the same command line either way.
    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
