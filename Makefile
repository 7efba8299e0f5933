# The two commands of the README: `make demo` and `make test`. Both do ALL set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INFERTOOL := $(VENV)/bin/infertool
DEMO_OUT ?= out
TEST_WORKERS ?= auto
SLOW_WORKERS ?= 2

.PHONY: demo test test-fast venv venv-test envs browser bench clean

# The light main environment: the CLI. Backends live in managed envs (see README).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar off --disable-pip-version-check -q -e .
	touch $@

# The test runner and what only the tests use (pytest and pytest-xdist, mypy and PyYAML's stubs, Optuna and Ray
# for tune, kubernetes-validate).
$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install --progress-bar off --disable-pip-version-check -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

venv-test: $(VENV)/.installed-test

# The managed backend environments (idempotent: up-to-date ones are left alone).
envs: venv
	$(INFERTOOL) env setup quant serve llmcompressor lmeval

# Debian's Chromium for the report's browser test (best effort: without it that one test skips, saying why).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  echo "chromium is not installed: the report's browser test will skip"

# The type check first (mypy over infertool/, its settings in pyproject.toml: any error fails the build), then
# everything that can run on this machine: the fast tests on every core (pytest-xdist), then the slow ones two
# files at a time (each starts vLLM or a backend, and waits on it much of its time: two side by side took 672 s
# where one at a time took 950-1050 s); gpu tests skip without CUDA.
test: venv-test envs browser
	$(PY) -m mypy
	INFERTOOL_REQUIRE_ENVS=1 $(PY) -m pytest -n $(TEST_WORKERS) -m "not slow"
	INFERTOOL_REQUIRE_ENVS=1 $(PY) -m pytest -n $(SLOW_WORKERS) --dist loadfile -m slow

# The type check, then only the fast tests (no managed environments needed), on every core.
test-fast: venv-test
	$(PY) -m mypy
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow"

# The main job on the bundled model: the quickstart recipe end to end into one run directory, then its report.
# `infertool run` exits 1 when the eval verdict is FAIL or INCONCLUSIVE (the tool working: 4-bit damages a
# 135M model); the demo shows that verdict and still succeeds. Any other failure stops it.
demo: venv
	$(INFERTOOL) env setup quant serve
	$(INFERTOOL) validate quickstart
	$(INFERTOOL) model import bundled:smollm2-135m $(DEMO_OUT)/smollm2-135m --force
	$(INFERTOOL) model info $(DEMO_OUT)/smollm2-135m
	$(INFERTOOL) plan quickstart
	$(INFERTOOL) run quickstart --out $(DEMO_OUT)/runs; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 1 ] || exit $$rc
	$(INFERTOOL) report "$$(ls -td $(DEMO_OUT)/runs/quickstart-* | head -1)"

bench: venv
	$(PY) benchmarks/startup.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .mypy_cache
