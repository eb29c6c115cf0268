# Set-up and everyday commands. `make run` and `make test` work from a clean clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A plain `torch` requirement resolves to a large CUDA build; this pin takes the
# CPU wheel where one is on disk and the usual (CUDA) wheel elsewhere.
TORCH ?= torch==2.13.0

# The default benchmark: finishes in about 2 minutes on a 2-core CPU.
RUN_ARGS ?= -p 128,512 -n 32 --pg 256,32 -c 1,4 -r 2

.PHONY: install run test clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/prefillbench run $(RUN_ARGS)

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
