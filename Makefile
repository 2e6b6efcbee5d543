# specdeploy — developer entry points. `make demo` runs the main job, `make test` runs everything.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLUSTER_DIR ?= .cluster
NODEPOOLS ?= hack/cluster/nodepools.yaml
# AUTOSCALING=0: no custom metrics adapter and no Cluster Autoscaler (default: on; same as SPECDEPLOY_AUTOSCALING)
AUTOSCALING ?=
PYTEST_ARGS ?=
# `make test` runs the tests on this many pytest-xdist workers, a file at a time each; a worker that runs a
# cluster test starts its own local cluster (two on a 2-core machine: the cluster tests mostly wait)
TEST_WORKERS ?= 2

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

PIP_INSTALL := $(PY) -m pip install --quiet -c hack/constraints.txt
PYPROJECTS := operator/pyproject.toml server/pyproject.toml server/testkit/pyproject.toml hack/cluster/pyproject.toml

# What the demo and the local cluster run: both packages (the server with its PyTorch backend and the demo's
# client), the test kit (the demo's models) and the local-cluster harness.
$(VENV)/.runtime: $(PYPROJECTS) hack/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e ./operator -e './server[demo]' -e ./server/testkit -e ./hack/cluster
	@touch $@

# The same with the test extras: linters, test tools and the client libraries tests/clients drives.
$(VENV)/.installed: $(VENV)/.runtime
	$(PIP_INSTALL) -e './operator[test]' -e './server[test]' -e ./server/testkit -e ./hack/cluster
	@touch $@

.PHONY: venv-runtime
venv-runtime: $(VENV)/.runtime ## create/refresh .venv with what the demo runs (no test extras)

.PHONY: venv
venv: $(VENV)/.installed ## create/refresh the virtualenv in .venv: both packages with their test extras, the test kit and the local-cluster harness

.PHONY: bins
bins: ## build (or find cached) what the local cluster runs (kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok, the LeaderWorkerSet controller, helm, prometheus, prometheus-adapter, cluster-autoscaler) and the tests' promtool and KEDA CRDs
	@hack/cluster/build.sh >/dev/null

.PHONY: lint
lint: venv ## ruff (lint + format check) and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy operator/src server/src server/testkit/src hack/cluster/src tests benchmarks hack/demo_client.py \
	  hack/demo_pods.py hack/docgen.py hack/doc_words.py hack/measure.py hack/dashboard_picture.py

.PHONY: fmt
fmt: venv ## format the code with ruff
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

.PHONY: test
test: venv bins lint ## the whole suite: lint, unit, server and integration tests (TEST_WORKERS local clusters)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## only the tests that need no cluster
	$(PY) -m pytest -m 'not integration' $(PYTEST_ARGS)

.PHONY: crds
crds: venv ## regenerate crds/, the chart's crds/ and docs/api.md from the pydantic models (a test fails if they are stale)
	$(PY) -m specdeploy_operator.crdgen --out-dir crds --out-dir charts/specdeploy/crds --docs docs/api.md

.PHONY: docs
docs: venv bins ## regenerate the docs' tables from the code, the chart and the measurement records (tests fail if they are stale)
	$(PY) hack/docgen.py
	$(PY) -m benchmarks.records

.PHONY: words
words: ## words per file of README.md and docs/ (docs/api.md, generated, not counted), the total and its budget
	@$(PYTHON) hack/doc_words.py

# Each measuring command writes its record, benchmarks/results/<name>.json, and the doc block rendered from it.
.PHONY: bench-server
bench-server: venv ## server benchmarks (RUNS=3 for medians) -> benchmarks/results/server-*.json, docs/benchmarks-server.md
	$(PY) -m benchmarks.server $(if $(RUNS),--runs $(RUNS))

.PHONY: bench-operator
bench-operator: venv bins ## operator at scale on its own simulated cluster (100 deployments, COUNT=1000 for 1 000; 2 min steady state) -> docs/benchmarks.md
	$(PY) -m benchmarks.operator $(if $(COUNT),--count $(COUNT))

.PHONY: bench-autoscaling
bench-autoscaling: venv bins ## real load -> metric -> HPA -> new node -> new replica serving, and back, vs a Deployment+HPA -> docs/benchmarks.md
	$(PY) -m benchmarks.autoscaling

.PHONY: chaos
chaos: venv bins ## reliability campaign: the server (fuzzing, overload, disconnects, slow clients, 10 min soak), then the operator (kills, control-plane faults, HA) -> docs/reliability.md
	$(PY) -m benchmarks.reliability $(if $(QUICK),--quick)
	$(PY) -m benchmarks.operator_faults $(if $(QUICK),--fast)

.PHONY: measure
measure: ## time NAME (make test, a cold .ci/run, make demo, build.sh ...; `python3 hack/measure.py --list`) -> docs/development.md
	@test -n "$(NAME)" || { $(PYTHON) hack/measure.py --list; echo 'usage: make measure NAME=<name>'; exit 2; }
	$(PYTHON) hack/measure.py $(NAME)

.PHONY: bench-memory
bench-memory: venv bins ## resident memory of a server on the demo models, of import torch, of the local cluster -> docs/local-cluster.md
	$(PY) -m benchmarks.memory

.PHONY: cluster-up
# The binaries it runs build while pip installs the virtualenv (downloads and unpacking beside the compiler).
# `make`, not $(MAKE): `make -n` must print this line, not run it.
cluster-up: ## start the local control plane + kwok GPU node pools; kubeconfig in .cluster/kubeconfig
	@what=core; [ "$(or $(AUTOSCALING),$${SPECDEPLOY_AUTOSCALING:-1})" = 0 ] || what="core autoscaling"; \
	hack/cluster/build.sh $$what >/dev/null & build=$$!; make --no-print-directory $(VENV)/.runtime; wait $$build
	$(if $(AUTOSCALING),SPECDEPLOY_AUTOSCALING=$(AUTOSCALING)) $(PY) -m specdeploy_localcluster up --dir $(CLUSTER_DIR) --nodepools $(NODEPOOLS)

.PHONY: cluster-down
# `down` needs only the standard library: it runs from the harness's sources, with or without the virtualenv.
cluster-down: ## stop every process of the local cluster and remove its state
	@py=$(PYTHON); if [ -x $(PY) ]; then py=$(abspath $(PY)); fi; \
	cd hack/cluster/src && $$py -m specdeploy_localcluster down --dir $(abspath $(CLUSTER_DIR))

.PHONY: demo
# The demo uses nothing of the autoscaling chain (Prometheus, prometheus-adapter, the Cluster Autoscaler), which
# would double a first run's build: its cluster runs without them unless AUTOSCALING=1.
demo: export SPECDEPLOY_AUTOSCALING ?= 0
demo: cluster-up ## the main job on the local simulated GPU cluster (AUTOSCALING=1: with the autoscaling chain)
	hack/demo.sh $(CLUSTER_DIR)
