# edgeplug: the two commands README.md opens with are `make demo` and `make test`.
# Both install what they need first, so they work the same on a laptop, a CI runner and a fresh
# machine: the Debian packages of .ci/apt/*.txt (as root, or through `sudo -n`), a project
# virtual environment (.venv, made from the `python3` found on PATH; the machine's own Python is
# left alone), the control-plane binaries and Helm, built from their Go modules and cached in
# ~/.cache/edgeplug. `make test` also builds the OCI images its tests check (build/images).

# The interpreter the virtual environment is made from (only used to create it).
PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
# Inside the venv, so removing the venv removes the record that the project is installed in it.
VENV_STAMP := $(VENV)/.edgeplug-installed
DEMO_STAMP := $(VENV)/.edgeplug-demo-installed
IMAGES_DIR := build/images
# Agent images `make images` builds (deploy/images/build-oci.sh); `all` is what the tests check.
AGENT_HANDLER_SETS ?= all
export AGENT_HANDLER_SETS
empty :=
space := $(empty) $(empty)
# The record that build/images holds the images of these sets built from the inputs below.
IMAGES_STAMP := $(IMAGES_DIR)/.built-$(subst $(space),+,$(strip $(AGENT_HANDLER_SETS)))
# What build-oci.sh builds from (its own inputs_digest reads the same list).
IMAGE_INPUTS := $(shell find pyproject.toml README.md agent controller crds cli discovery_handlers \
  deploy/images -type f -not -path '*/__pycache__/*' -not -name '*.pyc' 2>/dev/null)

# Recipes run with the venv first on PATH: console scripts (lint-imports, edgeplug-agent) and
# any `python3` a test starts by name are the venv's. Go and everything else are found as before.
HOST_PATH := $(PATH)
export PATH := $(CURDIR)/$(VENV)/bin:$(HOST_PATH)
export VIRTUAL_ENV := $(CURDIR)/$(VENV)

# The compatibility run (README, "Kubernetes versions"): the oldest minor upstream supports, on
# the tests whose guarantees must hold there too. Every other test runs on the newest only.
# (`oldest`: tests/harness/kubebin.py pins it.)
COMPAT_VERSION := oldest
COMPAT_TESTS := \
  tests/e2e/test_brokers_debug_echo.py tests/e2e/test_ascend_npus.py tests/e2e/test_udev_brokers.py \
  tests/e2e/test_onvif_brokers.py tests/e2e/test_opcua_brokers.py \
  tests/e2e/test_realnode_brokers.py tests/e2e/test_realnode_ascend.py \
  tests/faults/test_shared_race.py tests/faults/test_kubelet_storm.py \
  tests/faults/test_agent_kills.py tests/faults/test_unpinned_handoff.py \
  tests/integration/test_helm.py tests/integration/test_rbac.py \
  tests/integration/test_agent_rights.py tests/integration/test_attacks_agent.py \
  tests/integration/test_dra_features_served.py tests/integration/test_devicenode_agent.py \
  tests/integration/test_shared_allocation.py tests/integration/test_attacks_liveness.py

.PHONY: aptdeps aptdeps-venv install venv controlplane controlplane-compat helm realnode realnode-compat \
  thirdparty demo test test-newest test-compat lint unit bench images clean clean-cache

# Debian packages (.ci/apt/*.txt): only asks dpkg when all are there. The venv itself needs
# python3-venv (.ci/apt/venv.txt), all that `make demo` needs from Debian.
aptdeps:
	tests/harness/aptdeps.sh

aptdeps-venv:
	tests/harness/aptdeps.sh venv

$(VENV_PY): | aptdeps-venv
	PATH="$(HOST_PATH)" $(PYTHON) -m venv --clear $(VENV)

$(VENV_STAMP): pyproject.toml | $(VENV_PY)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(VENV_STAMP)

venv: $(VENV_STAMP)

# What the demo runs and nothing more: the agent and the controller (no test tools).
$(DEMO_STAMP): pyproject.toml | $(VENV_PY)
	@echo "installing edgeplug, its agent and its controller into $(VENV) (pip)"
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[controller]'
	touch $(DEMO_STAMP)

install: aptdeps $(VENV_STAMP) controlplane helm

controlplane: $(VENV_STAMP)
	$(VENV_PY) -m tests.harness.kubebin

controlplane-compat: $(VENV_STAMP)
	EDGEPLUG_KUBE_VERSION=$(COMPAT_VERSION) $(VENV_PY) -m tests.harness.kubebin

helm: $(VENV_STAMP)
	$(VENV_PY) -m tests.harness.helmbin

# The real node's kubelet, containerd 2 (runc shim, ctr) and CNI plugins, for the tests only
# (tests/harness/realnodebin.py): not part of install, so `make demo` does not wait for it.
realnode: aptdeps $(VENV_STAMP)
	$(VENV_PY) -m tests.harness.realnodebin

realnode-compat: aptdeps $(VENV_STAMP)
	EDGEPLUG_KUBE_VERSION=$(COMPAT_VERSION) $(VENV_PY) -m tests.harness.realnodebin

# Implementations we did not write that the tests run beside ours, built or installed once into
# ~/.cache/edgeplug: node-opcua (npm, from its lock file) and Akri's handler protocol on
# upstream tonic/h2 (cargo, from its Cargo.lock). The tests would make them on first use; here
# their time is counted with the other builds, not inside a test's timeout.
thirdparty: $(VENV_STAMP)
	$(VENV_PY) -m tests.harness.opcua_nodeopcua
	$(VENV_PY) -c 'from tests.harness import akri_rust_handler; print(akri_rust_handler.binary())'

# The demo installs and builds only what it runs: python3-venv, the venv, the control plane and
# cditool (the CDI resolver the emulated node's runtime uses); each build is cached in
# ~/.cache/edgeplug and says what it builds and how long it took.
demo: aptdeps-venv $(DEMO_STAMP)
	$(VENV_PY) -m tests.harness.kubebin >/dev/null
	$(VENV_PY) -m tests.harness.cdi >/dev/null
	$(VENV_PY) -m tests.harness.demo

lint: $(VENV_STAMP)
	$(VENV_PY) -m ruff check .
	$(VENV_PY) -m mypy agent controller discovery_handlers crds cli tests
	$(VENV)/bin/lint-imports

# images: tests/integration/test_images.py runs what they hold (rebuilt only when an input changed).
# Both runs go ahead whatever the first one found; the target fails if either failed.
test: install lint images realnode thirdparty controlplane-compat realnode-compat
	@status=0; \
	echo "== the suite on Kubernetes $$($(VENV_PY) -c 'from tests.harness import kubebin; print(kubebin.NEWEST_VERSION)')"; \
	$(VENV_PY) -m pytest -q || status=$$?; \
	echo "== compatibility run on Kubernetes $$($(VENV_PY) -c 'from tests.harness import kubebin; print(kubebin.OLDEST_VERSION)')"; \
	EDGEPLUG_KUBE_VERSION=$(COMPAT_VERSION) $(VENV_PY) -m pytest -q $(COMPAT_TESTS) || status=$$?; \
	exit $$status

# One of the two runs alone (what `make test` runs after installing and linting).
test-newest: install images realnode thirdparty
	$(VENV_PY) -m pytest -q

test-compat: install images thirdparty controlplane-compat realnode-compat
	EDGEPLUG_KUBE_VERSION=$(COMPAT_VERSION) $(VENV_PY) -m pytest -q $(COMPAT_TESTS)

bench: install
	$(VENV_PY) -m tests.bench

# OCI image archives of the agent and the controller, built without a container engine
# (mmdebstrap and umoci from Debian; see deploy/README.md).
# A file target: a second `make images` (or `make test`) with no input changed runs nothing.
images: $(IMAGES_STAMP)

# The record takes the time the build started, so an input edited during the build is newer.
$(IMAGES_STAMP): $(IMAGE_INPUTS) | aptdeps $(VENV_STAMP)
	mkdir -p $(IMAGES_DIR) && rm -f $(IMAGES_DIR)/.built-* && touch $(IMAGES_DIR)/.building
	PYTHON=$(CURDIR)/$(VENV_PY) deploy/images/build-oci.sh $(IMAGES_DIR)
	mv $(IMAGES_DIR)/.building $@

# What the two commands made in the working tree. The control-plane and Helm binaries in
# ~/.cache/edgeplug stay (a rebuild is minutes); `make clean-cache` removes them too.
clean:
	rm -rf $(VENV) .venv-stamp build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

clean-cache: clean
	rm -rf "$${EDGEPLUG_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/edgeplug}"
