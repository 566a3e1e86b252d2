# Two entry points for a newcomer: `make test` and `make train`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-all lint train bench clean

# The tested versions (constraints.txt) inside pyproject.toml's ranges: reproducible installs.
$(STAMP): pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .

# Default suite: everything but GPU tests, two xdist workers (one per core).
test: $(STAMP) lint
	HYDRA_FULL_ERROR=1 $(PY) -m pytest -m "not gpu" -n 2 --durations=15

train: $(STAMP)
	$(PY) -m mmtf.train experiment=audio_captioning

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
