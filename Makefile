# `make train` and `make test` set everything up on a fresh machine (idempotent), then run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NGPU   ?= 2
DUMP   ?= outputs/llama3_debug

.PHONY: train test test-slow lint format venv clean

venv: $(STAMP)

# Re-install only when the package definition changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

train: $(STAMP)
	NGPU=$(NGPU) PATH=$(CURDIR)/$(VENV)/bin:$$PATH ./run_train.sh --job.dump_folder=$(DUMP) \
		--validation.enable=true --validation.freq=10 --validation.steps=2 $(ARGS)
	$(PY) scripts/plot_loss.py $(DUMP)/metrics.jsonl --out $(DUMP)/loss.png

test: $(STAMP)
	$(PY) -m pytest -q -x --durations=10 $(PYTEST_ARGS)

# ruff format --check and ruff check over the whole repository (config: pyproject.toml [tool.ruff])
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

# rewrite the tree as `make lint` wants it (format, then the safe automatic lint fixes)
format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs
