# embedfleet developer entry points. Everything installs into .venv first (make install).
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
COMPONENTS := common worker fleet operator bench testing
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist); tests/conftest.py groups the tests that share a cluster or a
# directory's fixtures. 0: one process. Three on two cores: the real-node and KWOK groups mostly
# wait, and a third process computes meanwhile (docs/development.md, "How long make test takes").
PYTEST_WORKERS ?= 3
# Each build step and the tests report their wall and CPU seconds on stderr (hack/timed.sh).
TIMED = bash hack/timed.sh

.PHONY: install prepare run test lint format proto tools gateway gateway-tests worker-front node \
	prometheus image-tools images images-lock bench clean

# The Python components in .venv, then the gateway binary and the workers' Rust front (cargo; its
# progress on the terminal), each reused when unchanged.
install: $(STAMP) gateway worker-front

# Reinstall only when a pyproject changes; a fresh clone reuses the last clone's venv when no
# pyproject differs (hack/venv.sh: hard links from ~/.cache/embedfleet/venv), else pip (its cache kept).
$(STAMP): pyproject.toml $(foreach c,$(COMPONENTS),$(c)/pyproject.toml)
	$(TIMED) venv bash hack/venv.sh $(PY) $(VENV) $(COMPONENTS)
	touch $@

run: install
	$(BIN)/embedfleet serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	MYPY_CACHE_DIR=$${EMBEDFLEET_CACHE:-$$HOME/.cache/embedfleet}/mypy $(TIMED) mypy $(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

proto: install
	$(BIN)/python -m grpc_tools.protoc -I common/src --python_out=common/src --pyi_out=common/src \
		--grpc_python_out=common/src common/src/embedfleet/common/proto/embedfleet.proto

# Builds (or reuses from ~/.cache/embedfleet) etcd, kube-apiserver, ..., kubectl, helm, kwok.
tools:
	$(TIMED) tools bash hack/build-tools.sh

# The gateway (gateway/, docs/gateway.md), built or reused from ~/.cache/embedfleet/gateway;
# cargo fetches its crates from crates.io on a cold machine. `embedfleet serve` finds the build.
# CARGO_JOBS: cargo's jobs (default CARGO_BUILD_JOBS, else every core; `make prepare` sets 2).
CARGO_JOBS ?= $(or $(CARGO_BUILD_JOBS),$(shell nproc))
gateway:
	CARGO_BUILD_JOBS=$(CARGO_JOBS) $(TIMED) gateway bash hack/build-gateway.sh

# The gateway crate's test executables (tests/gateway/test_cargo.py runs them), compiled or
# reused by content beside the binary (embedfleet.testing.cargo_tests): a fresh clone's `cargo
# test` would recompile the crate, judged by its files' new mtimes.
gateway-tests: install
	$(TIMED) gateway-tests $(BIN)/python -m embedfleet.testing.cargo_tests

# The worker's Rust front (worker-front/, `embedfleet-worker --front rust`), a Python extension
# built or reused from ~/.cache/embedfleet/worker-front; after `gateway`, whose target directory
# (and dependencies) it shares.
worker-front: gateway
	CARGO_BUILD_JOBS=$(CARGO_JOBS) $(TIMED) worker-front bash hack/build-rust.sh worker-front

# One real node's parts: runc, nft, ip, nsenter, gcc from Debian (idempotent), then kubelet,
# kube-proxy, containerd, CNI plugins and the harness images, built or reused from
# ~/.cache/embedfleet/node. After `tools`: kubelet and kube-proxy reuse its compiled packages.
node: tools
	$(TIMED) node-deps bash hack/install-node-deps.sh
	$(TIMED) node bash hack/build-node.sh

# Debian's prometheus + promtool, for the dashboard and alert tests (idempotent).
prometheus:
	$(TIMED) prometheus bash hack/install-prometheus.sh

# Debian's buildah, debootstrap and runc, for `make images` and tests/images (idempotent).
image-tools:
	$(TIMED) image-tools bash hack/install-image-tools.sh

# Builds (or reuses, keyed by content) the operator, gateway and CPU worker images on a Debian base
# made by debootstrap, with no registry and no network in the build; writes each as a docker-archive
# under ~/.cache/embedfleet/images and prints {image ref: archive} as JSON. The gateway image
# carries the Rust gateway, built first by hack/build-gateway.sh when not cached.
# IMAGES=operator,gateway,worker-cpu,worker adds the CUDA worker. See docs/development.md, "Images".
IMAGES ?= operator,gateway,worker-cpu
images: install image-tools
	$(TIMED) images $(BIN)/python -m embedfleet.testing.images --images $(IMAGES)

# Re-resolves docker/locks/*.txt (the images' pinned dependencies) against PyPI.
images-lock: install
	$(BIN)/python -m embedfleet.testing.images lock

# Everything a test needs, built or reused, each step as soon as its prerequisites are done (make -j):
# the CPU-bound compiles (`tools` then `node` in Go, `gateway` in Rust: tens of minutes cold) run
# beside pip, apt and the image builds, which mostly wait on the network and the disk, so a cold
# machine waits for the longest chain, not the sum. The installers take turns at apt
# (hack/lib/apt.sh). `images` builds the gateway image, which carries the gateway binary, last.
prepare:
	@export EMBEDFLEET_PREPARE_START=$$(date +%s); \
	$(TIMED) prepare $(MAKE) --no-print-directory -j CARGO_JOBS=$(or $(CARGO_BUILD_JOBS),2) \
		tools node gateway gateway-tests worker-front install prometheus image-tools images lint

# Images first (reused when their content key is cached): a build inside a test would count
# against that test's timeout. Each test's id and result on its own line as it ends (-v, its
# duration in place of the percentage), written through (PYTHONUNBUFFERED: a CI log reads a pipe);
# the 40 slowest tests are listed at the end: where CI time goes.
test: prepare
	PYTHONUNBUFFERED=1 $(TIMED) pytest $(BIN)/pytest -v -o console_output_style=times \
		--durations=40 -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m embedfleet.bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
