# Two entry points, both self-contained on a fresh machine:
#   make demo   set up .venv, run a 2-rank profiled CPU training job into runs/
#   make test   set up .venv, run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU machines take the pinned CPU wheel (an unpinned torch pulls a multi-GB
# CUDA build); machines with an NVIDIA driver take the default CUDA build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
RUNS   ?= runs

.PHONY: demo test lint format-check install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[train,dashboard,dev,trackers,ray,integrations]'
	# Bytecode for the project's own modules, as pip writes it for installed
	# wheels: an editable install has none until a first import writes it,
	# and never where PYTHONDONTWRITEBYTECODE is set (~0.1 s per analyzer run).
	$(BIN)/python -m compileall -q analyzer recorder reftrain dashboard
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/reftrain --nproc 2 --runs-dir $(RUNS) --demo

# Machine-checked habits: ruff's defect rules, the import
# contracts and mypy, all configured in pyproject.toml ([tool.importlinter],
# [tool.mypy]; docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check --quiet .
	$(BIN)/ruff format --check --quiet .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# The formatter's check ([tool.ruff.format]): fails while a file is not as `ruff format` writes it.
# Not yet part of lint: the tree is formatted once, then lint runs this too.
format-check: $(STAMP)
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
