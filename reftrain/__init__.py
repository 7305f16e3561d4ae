"""reftrain: an instrumented reference distributed trainer (see docs/reftrain.md)."""
