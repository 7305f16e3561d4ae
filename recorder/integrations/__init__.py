"""Adapters from training frameworks' callback events to the recorder (docs/record.md).

Each module imports its framework; install them with ``pip install 'trainperf[integrations]'``.
"""
