# Named intents. `make bench` runs the main job, `make test` the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PRESET ?= default
ARGS ?=
RUN ?= results/latest

.PHONY: setup test test-fast bench gate microbench project lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

test: setup  ## all tests, slow ones included
	$(PY) -m pytest -q

test-fast: setup  ## skip the slow end-to-end and 4-rank tests
	$(PY) -m pytest -q -m "not slow"

bench: setup  ## the main job: protocols x policies x repeats, results/latest
	$(PY) -m bench run --preset $(PRESET) $(ARGS)

gate: setup  ## quick CI preset, its micro-benchmarks, then the perf gate vs results/baseline
	$(PY) -m bench run --preset ci $(ARGS)
	$(PY) -m bench microbench results/latest
	$(PY) -m bench gate results/latest --baseline results/baseline

microbench: setup  ## pytest-benchmark micro-benchmarks saved into results/latest
	$(PY) -m bench microbench results/latest

project: setup  ## overhead projection to TP 2-64, PP 1-4 of a run: make project RUN=results/latest
	$(PY) -m bench project $(RUN) $(ARGS)

lint: setup
	$(PY) -m ruff check hicache bench tests scripts

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
