# sandbox-mcp: the two commands are `make demo` (the walkthrough) and `make check` (every test).
# Everything else these targets need is installed under .tools/ by tests/interop/setup.sh.

CARGO ?= cargo
BIN := target/release/sandbox-mcp
# Tests that send group signals run in a private pid namespace when this machine allows one.
PIDNS := $(shell unshare -fp --mount-proc true >/dev/null 2>&1 && echo "unshare -fp --mount-proc")

.PHONY: build quick test check demo bench soak fuzz fmt clippy interop setup clean

build:
	$(CARGO) build --release

setup:
	tests/interop/setup.sh

# Unit and integration tests only (the real binary over stdio and HTTP, the E2B emulator): no
# interop setup, nothing installed, no network once cargo has the crates. The host needs busybox
# and shellcheck (tests/README.md).
quick:
	$(CARGO) build --workspace
	$(PIDNS) $(CARGO) test --workspace --all-targets

# Unit and integration tests (the real binary over stdio and HTTP), the interoperability tests
# with the official Python SDK, the MCP Inspector and the MCP conformance suite, then a
# 10-second run of each fuzz target, and a 20-second load and soak run (tests/soak/driver.rs).
test: build setup
	$(CARGO) build --workspace
	$(PIDNS) $(CARGO) test --workspace --all-targets
	tests/fuzz/run.sh
	tests/interop/run.sh
	$(CARGO) build --release --example soak
	SOAK_SECONDS=20 $(PIDNS) target/release/examples/soak

fmt:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# What CI runs: formatting, lints, then every test.
check: fmt clippy test

# The durable-task walkthrough (docs/contract.md, "The walkthrough") on the local provider, step by step.
demo: build
	$(BIN) --provider local demo

# Benchmarks against floors and peers measured in the same run; raw results in bench-results/.
bench: build setup
	tests/bench/run.sh

# Coverage-guided fuzzing of the parsers (tests/fuzz/run.sh): FUZZ_SECONDS per target, 10 by
# default; `make fuzz FUZZ_SECONDS=3600` for long runs.
fuzz:
	tests/fuzz/run.sh

# The long load and soak run: 64 HTTP clients and 4 stdio sessions for 10 minutes.
soak: build
	$(CARGO) build --release --example soak
	SOAK_SECONDS=$${SOAK_SECONDS:-600} $(PIDNS) target/release/examples/soak

clean:
	$(CARGO) clean
	rm -rf .tools bench-results
