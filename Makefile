# podcost — the two commands (`make test`, `make demo`) and the local servers.
# Everything installs what it needs, idempotently; slow steps are cached in ~/.cache/podcost.

PYTHON ?= python3
UV_VERSION := 0.13.9
UV := $(PYTHON) -m uv
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(CURDIR)/.venv
RUN := $(UV) run --frozen --quiet
# A test that hangs fails after this many seconds with its asyncio tasks' stacks
# (tests/support/hang.py) instead of holding the run until CI's own limit.
TEST_TIMEOUT ?= 900
# The per-test bound of make test-long, for a long test that names none of its own.
LONG_TEST_TIMEOUT ?= 1800

.DEFAULT_GOAL := help
.PHONY: help setup tools tools-kafka tools-cluster observability-tools karpenter-tools lint \
        typecheck contracts check unit integration e2e test test-long bench bench-table docs \
        docs-serve demo demo-fleet image \
        kafka-up kafka-down cluster-up cluster-down compose-up compose-down clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup:  ## install uv and the locked Python environment (.venv)
	@$(PYTHON) -m uv --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet "uv==$(UV_VERSION)"
	@$(UV) sync --frozen --all-extras --python $(PYTHON) --quiet

tools: setup  ## build the Kafka broker, the control plane, helm and docker-compose into ~/.cache/podcost (once)
	@$(RUN) podcost-localinfra build

observability-tools: setup  ## build jaeger, prometheus and promtool into ~/.cache/podcost (once; the tests that use them)
	@$(RUN) podcost-localinfra build --only jaeger
	@$(RUN) podcost-localinfra build --only prometheus

karpenter-tools: setup  ## build Karpenter with its kwok cloud provider into ~/.cache/podcost (once; the long node-autoscaler tests and bench)
	@$(RUN) podcost-localinfra build --only karpenter

# What one target needs and nothing more: the demo and cluster-up need only the control plane,
# kafka-up only the broker's jars (helm and docker-compose serve the chart and compose tests).
tools-kafka: setup
	@$(RUN) podcost-localinfra build --only kafka

tools-cluster: setup
	@$(RUN) podcost-localinfra build --only cluster

lint: setup  ## ruff lint and format check
	$(RUN) ruff check .
	$(RUN) ruff format --check .

typecheck: setup  ## mypy --strict over libs, services and the local infra
	$(RUN) mypy

contracts: setup  ## import-linter layer contracts
	$(RUN) lint-imports

check: lint typecheck contracts  ## every static check

.PHONY: reference
reference: setup  ## rewrite the generated reference pages (docs/reference/, the chart README)
	$(RUN) podcost-localinfra reference

unit: setup  ## the pure tier: no servers
	$(RUN) pytest tests/unit examples/podcost-strategy-example/tests

integration: tools observability-tools  ## real Kafka broker and real control plane
	$(RUN) pytest --timeout=$(TEST_TIMEOUT) tests/integration

e2e: tools observability-tools  ## the whole pipeline against the real control plane
	$(RUN) pytest --timeout=$(TEST_TIMEOUT) tests/e2e

test: check tools observability-tools  ## everything CI runs: static checks, then all test tiers
	$(RUN) pytest --timeout=$(TEST_TIMEOUT) --durations=30 tests examples/podcost-strategy-example/tests

test-long: tools karpenter-tools  ## the long runs (300 differential scenarios, 30 s API outage) and the fuzz tests at >= 100,000 cases; fails if none
	PODCOST_LONG=1 $(RUN) pytest --timeout=$(LONG_TEST_TIMEOUT) tests -m "long or fuzz"

# Each benchmark records its headline figures into docs/benchmarks/results.json (tests/bench/record.py).
bench: export PODCOST_BENCH_RECORD := 1
bench: setup  ## benchmarks that print numbers (not tests); records them in docs/benchmarks/results.json
	$(RUN) python tests/bench/bench_core.py
	$(RUN) python tests/bench/bench_labels.py
	$(RUN) python tests/bench/bench_rank_aggregate.py
	$(RUN) python -m tests.bench.bench_annotator
	$(RUN) python -m tests.bench.bench_pipeline
	$(RUN) python -m tests.bench.bench_fleet
	$(RUN) python -m tests.bench.bench_aggregator
	$(RUN) python -m tests.bench.bench_snapshot_decode
	$(RUN) python -m tests.bench.bench_watch_path
	$(RUN) python -m tests.bench.bench_watcher
	$(RUN) python -m tests.bench.bench_rankers --rankers combined --drain-seconds 60 --aggregator
	$(RUN) python -m tests.bench.bench_compression
	$(RUN) python -m tests.bench.bench_failover
	$(RUN) python -m tests.bench.bench_karpenter
	$(RUN) python -m tests.bench.bench_soak
	$(RUN) python -m tests.bench.record

bench-table: setup  ## re-render docs/benchmarks/results.md from docs/benchmarks/results.json
	$(RUN) python -m tests.bench.record

# mkdocs-material prints a banner about its successor on every build; the build is unaffected.
docs docs-serve: export NO_MKDOCS_2_WARNING := 1
docs: setup  ## build the docs site strictly (a broken link or a missing page fails) into site/
	$(RUN) mkdocs build --strict --site-dir site

DOCS_ADDR ?= 127.0.0.1:8000
docs-serve: setup  ## preview the docs site at DOCS_ADDR (127.0.0.1:8000), rebuilt on every change
	$(RUN) mkdocs serve --strict --dev-addr $(DOCS_ADDR)

demo: tools-cluster  ## the demo on an embedded default cluster
	$(RUN) podcost demo

demo-fleet: tools-cluster tools-kafka  ## the demo's scale-in in two clusters, one core over Kafka, every component a process
	$(RUN) podcost demo --fleet

image: setup  ## build the image podcost:<version> with podman (installed from Debian's packages); prints its size
	@$(RUN) podcost-localinfra image

compose-up: setup  ## docker compose up of docker-compose.yml against podman's API, cluster from KUBECONFIG; last line: export DOCKER_HOST=...
	@$(RUN) podcost-localinfra compose-up

compose-down: setup  ## docker compose down, and stop podman's API service compose-up started
	@$(RUN) podcost-localinfra compose-down

kafka-up: tools-kafka  ## start a Kafka broker; last line: its bootstrap address
	@$(RUN) podcost-localinfra kafka-up

kafka-down: setup  ## stop the broker started by kafka-up
	@$(RUN) podcost-localinfra kafka-down

cluster-up: tools-cluster  ## start the control plane; last line: export KUBECONFIG=<path>
	@$(RUN) podcost-localinfra cluster-up

cluster-down: setup  ## stop every process cluster-up started
	@$(RUN) podcost-localinfra cluster-down

clean:  ## remove the virtualenv and caches inside the repo (not ~/.cache/podcost)
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache .hypothesis
