"""Finding and reading traces: locate files, parse Kineto JSON into typed columns, cache them, read run directories (docs/loading.md). Imports nothing above it."""
