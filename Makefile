# Named intents. `make bench` runs the main job, `make test` the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PRESET ?= default
ARGS ?=

.PHONY: setup test test-fast bench gate compare microbench lint clean

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

compare: setup  ## two runs side by side: make compare A=results/<before> B=results/<after>
	$(PY) -m bench compare $(A) $(B) $(ARGS)

microbench: setup  ## pytest-benchmark micro-benchmarks saved into results/latest
	$(PY) -m bench microbench results/latest

lint: setup
	$(PY) -m ruff check hicache bench tests scripts

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
