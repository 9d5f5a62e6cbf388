# The two commands of the README: `make demo` (the main job on the embedded default pair) and
# `make test`. Both create .venv on first use and install what they need.
#
# Install order matters (docs/design.md section 6): torch 2.13.0 first (a CPU build; a
# bare `torch` requirement would pull a multi-GB CUDA build), then deepspeed without build
# isolation (its setup imports torch), then this package with its dev extras.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
DEEPSPEED_SPEC := deepspeed>=0.16,<0.20
PYTEST_ARGS ?=

.PHONY: install demo test lint bench-verify clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet setuptools wheel
	$(PY) -m pip install --quiet --no-build-isolation "$(DEEPSPEED_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

ARGS ?=

demo: install
	$(PY) -m distributed_spec.generate parallel=ray parallel.tp_size=2 $(ARGS)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check distributed_spec tests scripts research

bench-verify: install
	$(PY) -m scripts.bench_verify

clean:
	rm -rf $(VENV) *.egg-info outputs multirun
