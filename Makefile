# edgeplug: the two commands README.md opens with are `make demo` and `make test`.
# Both install what they need first, so they work the same on a laptop, a CI runner and a fresh
# machine: a project virtual environment (.venv, made from the `python3` found on PATH; the
# machine's own Python is left alone), the control-plane binaries and Helm, built from their Go
# modules and cached in ~/.cache/edgeplug.

# The interpreter the virtual environment is made from (only used to create it).
PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
# Inside the venv, so removing the venv removes the record that the project is installed in it.
VENV_STAMP := $(VENV)/.edgeplug-installed
IMAGES_DIR := build/images

# Recipes run with the venv first on PATH: console scripts (lint-imports, edgeplug-agent) and
# any `python3` a test starts by name are the venv's. Go and everything else are found as before.
HOST_PATH := $(PATH)
export PATH := $(CURDIR)/$(VENV)/bin:$(HOST_PATH)
export VIRTUAL_ENV := $(CURDIR)/$(VENV)

.PHONY: install venv controlplane helm demo test lint unit bench images clean clean-cache

$(VENV_PY):
	PATH="$(HOST_PATH)" $(PYTHON) -m venv --clear $(VENV)

$(VENV_STAMP): pyproject.toml | $(VENV_PY)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(VENV_STAMP)

venv: $(VENV_STAMP)

install: $(VENV_STAMP) controlplane helm

controlplane: $(VENV_STAMP)
	$(VENV_PY) -m tests.harness.kubebin

helm: $(VENV_STAMP)
	$(VENV_PY) -m tests.harness.helmbin

demo: install
	$(VENV_PY) -m tests.harness.demo

lint: $(VENV_STAMP)
	$(VENV_PY) -m ruff check .
	$(VENV_PY) -m mypy agent controller discovery_handlers crds tests
	$(VENV)/bin/lint-imports

test: install lint
	$(VENV_PY) -m pytest -q

bench: install
	$(VENV_PY) -m tests.bench

# OCI image archives of the agent and the controller, built without a container engine
# (mmdebstrap and umoci from Debian; see deploy/README.md).
images: $(VENV_STAMP)
	PYTHON=$(CURDIR)/$(VENV_PY) deploy/images/build-oci.sh $(IMAGES_DIR)

# What the two commands made in the working tree. The control-plane and Helm binaries in
# ~/.cache/edgeplug stay (a rebuild is minutes); `make clean-cache` removes them too.
clean:
	rm -rf $(VENV) .venv-stamp build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

clean-cache: clean
	rm -rf "$${EDGEPLUG_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/edgeplug}"
