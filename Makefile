# The two commands of the README: `make demo` and `make test`. Both do ALL set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INFERTOOL := $(VENV)/bin/infertool
DEMO_OUT ?= out

.PHONY: demo test test-fast venv envs bench clean

# The light main environment: the CLI and the test runner. Backends live in managed envs (see README).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar off --disable-pip-version-check -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The managed backend environments (idempotent: up-to-date ones are left alone).
envs: venv
	$(INFERTOOL) env setup quant serve

# Everything that can run on this machine, slow tests included; gpu tests skip without CUDA.
test: envs
	INFERTOOL_REQUIRE_ENVS=1 $(PY) -m pytest

# Only the fast tests (no managed environments needed).
test-fast: venv
	$(PY) -m pytest -m "not slow"

# The main job on the bundled model; grows as stages land.
demo: venv
	$(INFERTOOL) env setup quant
	$(INFERTOOL) validate recipes/quickstart.yaml
	$(INFERTOOL) model import bundled:smollm2-135m $(DEMO_OUT)/smollm2-135m --force
	$(INFERTOOL) model info $(DEMO_OUT)/smollm2-135m
	$(INFERTOOL) env list

bench: venv
	$(PY) benchmarks/startup.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
