# Two commands for a new user: `make run` and `make test` (README.md). Everything they need is
# installed from here into .venv; the control-plane binaries are built once into a cache
# outside the repository (hack/cluster.py).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=
CONFORMANCE_ARGS ?=
BENCHMARKS := usage scale replenish admission podset clusterquota applied measures measures_admission memory churn

.PHONY: install binaries helm kwok floor prometheus run test unit e2e conformance bench lint format down clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(INSTALLED)

install: $(INSTALLED)

# uvloop, apart from the environment tally runs in: Kopf's CLI runs the operator on uvloop's
# loop whenever it can import it, so in .venv it would move every e2e test and benchmark onto a
# loop tally does not ship with. The unit tests of the webhook server run again on it from here
# (tests/unit/webhook/test_webhook_server.py), since a deployment with kopf[uvloop] runs tally
# there.
UVLOOP := uvloop==0.22.1
UVLOOP_DIR := $(VENV)/uvloop
UVLOOP_INSTALLED := $(UVLOOP_DIR)/.installed

$(UVLOOP_INSTALLED): $(INSTALLED) Makefile
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade --target $(UVLOOP_DIR) '$(UVLOOP)'
	touch $(UVLOOP_INSTALLED)

binaries: $(INSTALLED)
	$(PY) hack/cluster.py build

# Helm at the version hack/helm/go.mod pins, for the chart's tests: built into the same cache
# (hack/helm.py), once. `make run` does not need it.
helm: $(INSTALLED)
	$(PY) hack/helm.py build

# kwok at the version hack/kwok/go.mod pins (hack/kwok.py), the simulated kubelet of
# `hack/cluster.py up --nodes N`: built into the same cache, once; `up --nodes` builds it too.
kwok: $(INSTALLED)
	$(PY) hack/kwok.py build

# The floor webhook (hack/floor.py: Go, standard library only) that bench/admission.py measures
# tally's admission against, built into the same cache; the benchmark builds it on demand too.
floor: $(INSTALLED)
	$(PY) hack/floor.py build

# Prometheus and promtool from Debian's package (hack/prometheus.sh), for the dashboard and
# alert-rule tests; skipped when both are on PATH.
prometheus:
	hack/prometheus.sh

run: binaries
	$(PY) hack/run.py

test: lint binaries helm kwok prometheus $(UVLOOP_INSTALLED)
	$(PY) -m pytest $(PYTEST_ARGS)

unit: $(INSTALLED) $(UVLOOP_INSTALLED)
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

e2e: binaries helm kwok prometheus
	$(PY) -m pytest -m e2e $(PYTEST_ARGS)

# Upstream's ResourceQuota e2e specs (its e2e.test, built once into the cache) against tally
# and against upstream's own quota system; fails if tally fails a spec upstream passes.
conformance: binaries
	$(PY) hack/conformance.py $(CONFORMANCE_ARGS)

# Every benchmark in turn at its default sizes (docs/performance.md), each writing
# bench/results/<name>.json and the picture beside it, then every picture drawn again by
# bench/plot.py. A benchmark that misses a target exits 1: the others still run, the pictures
# are still drawn, and `make bench` fails at the end naming it.
bench: binaries floor
	@failed=""; for name in $(BENCHMARKS); do \
		echo "== bench/$$name.py"; \
		$(PY) bench/$$name.py || failed="$$failed $$name"; \
	done; \
	$(PY) bench/plot.py; \
	if [ -n "$$failed" ]; then echo "missed a target or failed:$$failed"; exit 1; fi

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(INSTALLED)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Stops the control plane `make run` left running (after a kill -9, say) and deletes it.
down: $(INSTALLED)
	$(PY) hack/cluster.py down --dir .cluster/run --clean

clean: down
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
