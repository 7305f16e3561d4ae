"""Renderers: one module per output format, drawing the typed results the verbs compute.

* :mod:`~analyzer.render.format`: the formatters every renderer uses (numbers,
  percentages, kernel names, gated values, delta rows);
* :mod:`~analyzer.render.text`: what the CLI prints;
* :mod:`~analyzer.render.markdown`: the CI job summary, the suggestions table;
* :mod:`~analyzer.render.html` (charts from :mod:`~analyzer.render.svg`):
  self-contained pages, no script and no charting library;
* :mod:`~analyzer.render.junit`: JUnit XML (pytest's xunit2 schema);
* :mod:`~analyzer.render.github`: GitHub Actions annotations and step summary;
* :mod:`~analyzer.render.notebook`: the Jupyter views.

No renderer computes a metric. The package imports nothing itself, so that
importing one renderer loads only what it needs.
"""
