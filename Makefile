# Two entry points for a fresh machine (see README):
#   make demo   runs the main job on a built-in example
#   make test   runs the test suite
# Each creates .venv if it is missing, installs torch 2.13.0 (CPU build) first, then this package.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.meshshard-installed

.PHONY: demo test install clean bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,examples]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/heat_diffusion/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
