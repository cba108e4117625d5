# Two entry points for a fresh machine (see README):
#   make demo   runs the main job on a built-in example
#   make test   runs the test suite
# (make test-fast runs it without the tests marked slow; see tests/README.md.)
# Each creates .venv if it is missing, installs torch 2.13.0 (CPU build) first, then this package.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.meshshard-installed
# pytest-xdist workers: most tests start ranks in processes that wait on each other, so two
# workers keep 2 cores busy (7.6 instead of 9.5 minutes here). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

.PHONY: demo test test-fast install clean bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,examples]'
	@# bytecode of our own sources now: with PYTHONDONTWRITEBYTECODE set (as on CI) every process, a rank
	@# too, compiled them again (0.2 s of a core each, hundreds of processes in the suite)
	$(PY) -m compileall -q meshshard comm partition tests bench examples > /dev/null
	touch $(STAMP)
	@echo "installed: the meshshard command is $(VENV)/bin/meshshard (source $(VENV)/bin/activate to put it on PATH)"

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/heat_diffusion/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The tests not marked slow (each of the others takes about 10 s or more here): a quick check while working.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"

# The benchmarks of docs/benchmarks.md that the issues set targets for, at their default sizes
# (about half an hour on 2 cores; building the peers' torch-scatter takes 5 minutes of it).
bench: $(STAMP)
	$(PY) bench/partition.py
	$(PY) bench/train_memory.py
	$(PY) bench/predict.py
	$(PY) bench/rollout.py
	bash bench/setup_peers.sh
	$(PY) bench/meshgraphnet_peers.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
