#!/usr/bin/env bash
# Builds (or reuses) embedfleet-gateway and prints its path as its last line: hack/build-rust.sh
# for the gateway crate (its cache, key and flags are described there).
exec bash "$(dirname "${BASH_SOURCE[0]}")/build-rust.sh" gateway "$@"
