# embedfleet developer entry points. Everything installs into .venv first (make install).
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
COMPONENTS := common worker gateway operator bench testing
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install prepare run test lint format proto tools gateway-rs node prometheus image-tools images \
	images-lock bench clean

install: $(STAMP)

# Reinstall only when a pyproject changes; pip keeps its cache so a fresh venv is quick too.
$(STAMP): pyproject.toml $(foreach c,$(COMPONENTS),$(c)/pyproject.toml)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=25.1"
	$(BIN)/python -m pip install -q $(foreach c,$(COMPONENTS),-e ./$(c)) --group dev
	touch $@

run: install
	$(BIN)/embedfleet serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

proto: install
	$(BIN)/python -m grpc_tools.protoc -I common/src --python_out=common/src --pyi_out=common/src \
		--grpc_python_out=common/src common/src/embedfleet/common/proto/embedfleet.proto

# Builds (or reuses from ~/.cache/embedfleet) etcd, kube-apiserver, ..., kubectl, helm, kwok.
tools:
	bash hack/build-tools.sh

# The Rust gateway (gateway-rs/, docs/gateway.md "Rust gateway"), built or reused from
# ~/.cache/embedfleet/gateway-rs; cargo fetches its crates from crates.io on a cold machine.
gateway-rs:
	bash hack/build-gateway-rs.sh

# One real node's parts: runc, nft, ip, nsenter, gcc from Debian (idempotent), then kubelet,
# kube-proxy, containerd, CNI plugins and the harness images, built or reused from
# ~/.cache/embedfleet/node.
node:
	bash hack/install-node-deps.sh
	bash hack/build-node.sh

# Debian's prometheus + promtool, for the dashboard and alert tests (idempotent).
prometheus:
	bash hack/install-prometheus.sh

# Debian's buildah, debootstrap and runc, for `make images` and tests/images (idempotent).
image-tools:
	bash hack/install-image-tools.sh

# Builds (or reuses, keyed by content) the operator, gateway and CPU worker images on a Debian base
# made by debootstrap, with no registry and no network in the build; writes each as a docker-archive
# under ~/.cache/embedfleet/images and prints {image ref: archive} as JSON. The gateway image
# carries the Rust gateway, built first by hack/build-gateway-rs.sh when not cached.
# IMAGES=operator,gateway,worker-cpu,worker adds the CUDA worker. See docs/development.md, "Images".
IMAGES ?= operator,gateway,worker-cpu
images: install image-tools
	$(BIN)/python -m embedfleet.testing.images --images $(IMAGES)

# Re-resolves docker/locks/*.txt (the images' pinned dependencies) against PyPI.
images-lock: install
	$(BIN)/python -m embedfleet.testing.images lock

# Everything a test needs, built or reused. `gateway-rs` then `tools` (Rust and Go compiles: CPU,
# tens of minutes cold) run beside the rest (pip, apt, debootstrap: mostly network and disk), so a
# cold machine waits for the longer of the two chains, not their sum. The Rust gateway comes first
# because the gateway image carries it: `images` waits for that build (one builder per cache).
prepare:
	@$(MAKE) --no-print-directory gateway-rs tools & tools=$$!; \
	$(MAKE) --no-print-directory install node prometheus images lint; rc=$$?; \
	wait $$tools || rc=$$?; exit $$rc

# Images first (reused when their content key is cached): a build inside a test would count
# against that test's timeout. The 40 slowest tests are listed at the end: where CI time goes.
test: prepare
	$(BIN)/pytest --durations=40 $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m embedfleet.bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
