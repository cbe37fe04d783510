# edgeplug: the two commands README.md opens with are `make demo` and `make test`.
# Both install what they need first (Python packages, the control-plane binaries built from
# Kubernetes' Go modules and cached in ~/.cache/edgeplug), so they work on a fresh machine.

PYTHON ?= python3
PIP_STAMP := .venv-stamp

.PHONY: install controlplane demo test lint unit bench

$(PIP_STAMP): pyproject.toml
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(PIP_STAMP)

install: $(PIP_STAMP) controlplane

controlplane: $(PIP_STAMP)
	$(PYTHON) -m tests.harness.kubebin

demo: install
	$(PYTHON) -m tests.harness.demo

lint: $(PIP_STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy agent controller discovery_handlers crds tests
	lint-imports

test: install lint
	$(PYTHON) -m pytest -q

bench: install
	$(PYTHON) -m tests.bench
