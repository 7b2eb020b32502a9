# The two commands a newcomer needs: `make run` and `make test`. Each creates .venv and
# installs what it needs on first use (and again when a requirements file changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test reset lint synth bench clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m local

test: $(STAMP)
	$(PY) -m pytest

reset:
	rm -rf .local

clean: reset
	rm -rf $(VENV) cdk.out node_modules .pytest_cache
