# Named intents. `make bench` runs the main job, `make test` the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.dev-installed
PRESET ?= default
ARGS ?=
RUN ?= results/latest
JOBS ?= 2
MUTANTS ?=

SGLANG ?= 0.5.23
comma := ,
# SGLANG=0.5.18,0.5.19 (a list, labels allowed): make bench runs them as sides, the model beside
SGLANG_LIST = $(findstring $(comma),$(SGLANG))
SGLANG_SPECS = $(foreach s,$(subst $(comma), ,$(SGLANG)),$(lastword $(subst =, ,$(s))))

.PHONY: sglang-fetch sglang-ready sglang-slice sglang-check setup dev test test-fast test-long test-all test-stats bench delay-sweep gate compare microbench project lint mutate gpu-check clean

setup: $(STAMP)  ## runtime only: no network where python3 already imports the runtime deps

$(STAMP): pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

dev: $(DEV_STAMP)  ## pyproject.toml's dev extra: pytest, pytest-benchmark, pytest-timeout, ruff, scipy, perfetto (only those missing)

$(DEV_STAMP): $(STAMP)
	bash scripts/setup_env.sh --dev $(VENV)
	touch $(DEV_STAMP)

# make test and test-fast: the tests that time what they check (marker timed, the files in
# tests/tiers.py) run alone, after the others have run on $(WORKERS) pytest-xdist workers
# (serially without xdist). Three workers on two cores: the fast tier 150 s against 159 s on two.
WORKERS ?= 3
XDIST = $(shell $(PY) -c "import xdist" 2>/dev/null && echo "-n $(WORKERS) --dist loadfile")
TIMED_FILES = $(shell $(PY) -m tests.tiers timed)

# Bytecode is written (into __pycache__, which git ignores) even where the environment sets
# PYTHONDONTWRITEBYTECODE, as this machine's does: else every test process compiles hicache
# and bench again, every worker rewrites every test module's asserts, and every rank that
# loads SGLang compiles its decision path again (docs/testing.md, "Tiers").
PYTEST = PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

test: sglang-ready  ## all tests, slow ones included
	$(PYTEST) -q $(XDIST) -m "not timed"
	$(PYTEST) -q -m timed $(TIMED_FILES)

test-fast: sglang-ready  ## skip the slow end-to-end and 4-rank tests
	$(PYTEST) -q $(XDIST) -m "not slow and not timed"
	$(PYTEST) -q -m "not slow and timed" $(TIMED_FILES)

test-long: sglang-ready  ## the long end-to-end runs (marker long): each beside a shorter test of its path in make test; not in make test
	$(PYTEST) -q $(XDIST) -m "long and not timed"
	$(PYTEST) -q -m "long and timed" $(TIMED_FILES)

test-all: sglang-ready  ## every tier (make test, test-long, sglang-check, test-stats) in turn; the result recorded in docs/results/test_all.md
	$(PY) scripts/test_all.py

test-stats: dev  ## checks that hold at 95 %, so fail by chance now and then: not in make test
	$(PY) -m pytest -q -m statistical

bench: setup  ## the main job: protocols x policies x repeats, results/latest; SGLANG=0.5.18,0.5.19: those SGLangs, the model beside (preset seed-pr)
	$(PY) -m bench run $(if $(SGLANG_LIST),--preset seed-pr --sglang $(SGLANG),--preset $(PRESET)) $(ARGS)

delay-sweep: setup  ## make bench's workload at 0-3 ms added per control-plane collective: ratio against c, with the model (sweep.md)
	$(PY) -m bench run --preset delay-sweep $(ARGS)

# make exits 2 on any failure; the gate's own code (0 PASS, 1 FAIL, 77 INCONCLUSIVE) is the
# exit_code of results/latest/ab/decision.json (.ci/gate reads it; docs/gate-ci.md)
gate: dev  ## quick CI preset (its host work counted too), its micro-benchmarks, then the perf gate: counts vs the model and the host-work ceiling, timings vs the baseline revision run beside this tree
	$(PY) -m bench run --preset ci --host-work calls $(ARGS)
	$(PY) -m bench microbench results/latest
	$(PY) -m bench gate results/latest --baseline results/baseline --ab

compare: setup  ## two runs side by side: make compare A=results/<before> B=results/<after>
	$(PY) -m bench compare $(A) $(B) $(ARGS)

microbench: dev  ## pytest-benchmark micro-benchmarks saved into results/latest
	$(PY) -m bench microbench results/latest

project: setup  ## overhead projection to TP 2-64, PP 1-4 of a run: make project RUN=results/latest
	$(PY) -m bench project $(RUN) $(ARGS)

mutate: dev  ## mutation testing of the contract modules, not in CI (docs/testing.md): make mutate JOBS=2 [MUTANTS='hicache.*']
	$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install -q -e ".[mutate]"  # pyproject.toml's mutate extra
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children $(JOBS) $(MUTANTS)
	$(VENV)/bin/mutmut export-cicd-stats && cat mutants/mutmut-cicd-stats.json
	$(VENV)/bin/mutmut results

sglang-fetch: dev  ## --sglang's deps (msgspec, dill, packaging) when missing, and release $(SGLANG)'s wheel into the cache once (docs/sglang.md)
	$(PY) -c "import msgspec, dill, packaging" 2>/dev/null || $(PY) -m pip install -q msgspec dill packaging
	$(PY) -m sglang_adapter.source $(SGLANG_SPECS)

# make test's SGLang tests need the sglang extra in this venv and the wheels of releases
# $(TEST_RELEASES) in the cache (0.5.18: the sides tests that pair it with 0.5.23; 0.5.19:
# tests/test_seed_pr.py's preset test, which reads 0.5.18's and 0.5.19's classes): fetched here
# wherever the package index is reachable; where it is not, the tests that need them skip, each
# naming what this machine lacks (and the summary says how many).
TEST_RELEASES = $(sort 0.5.23 0.5.18 0.5.19 $(SGLANG_SPECS))
sglang-ready: dev  ## what make test needs of SGLang, fetched when missing; never fails
	@$(PY) -c "import msgspec, dill, packaging" 2>/dev/null || $(PY) -m pip install -q --retries 1 --timeout 15 msgspec dill packaging \
		|| echo "make test: cannot install the sglang extra here: SGLang tests will skip"
	@for r in $(TEST_RELEASES); do $(PY) -m sglang_adapter.source $$r >/dev/null \
		|| echo "make test: cannot fetch sglang $$r here: the SGLang tests that need it will skip"; done

SLICE_RELEASE ?= 0.5.18
sglang-slice: sglang-fetch  ## CI's cheap slice of sglang-check: release $(SLICE_RELEASE)'s poll and its bench run at TP2, SGLang's consensus checker on two hazard cells (about 2 min)
	$(PY) -m sglang_adapter.source $(SLICE_RELEASE)
	$(PYTEST) -q -m sglang_matrix tests/test_sglang_adapter.py tests/test_sglang_run.py \
		tests/test_sglang_consensus.py \
		-k "($(SLICE_RELEASE) and (2-1 or test_sglang_run)) or test_sglang_consensus"

sglang-check: sglang-fetch  ## SGLang's own poll in its other releases and layouts, a planted change, the hazard cells (not in make test)
	$(PY) -m sglang_adapter.source 0.5.19 0.5.18
	$(PY) -m pytest -q -m sglang_matrix tests/test_sglang_adapter.py tests/test_sglang_hazards.py \
		tests/test_sglang_run.py tests/test_sglang_controller.py tests/test_sglang_controller_pp.py \
		tests/test_sglang_controller_write.py tests/test_sglang_controller_write_back.py \
		tests/test_sglang_consensus.py tests/test_seed_pr.py

lint: dev
	$(PY) -m ruff check hicache bench tests scripts sglang_adapter

gpu-check:  ## on a GPU node: CUDA tests, llama3-8b TP1 run, TP2 shared-GPU run, H2D check
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache mutants
