# The README's test command is `make test`.
CARGO ?= cargo
SHELL := /bin/bash

.PHONY: build test lint fuzz demo churn

build:
	$(CARGO) build --release

# Runs every test of the workspace, then prints one summary line over all test binaries.
test: build
	set -o pipefail; $(CARGO) test --release --workspace 2>&1 | tee target/test.log
	@awk '/^test result:/ {p+=$$4; f+=$$6} END {printf "tests: %d passed, %d failed\n", p, f; exit (f > 0)}' target/test.log

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --release -- -D warnings

demo: build
	./target/release/tierstack demo

fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run superblock -- -max_total_time=60
	cd fuzz && $(CARGO) +nightly fuzz run summary -- -max_total_time=60
	cd fuzz && $(CARGO) +nightly fuzz run intent -- -max_total_time=60

# The long churn round (issue 35): 20,000 random operations against the mount and a plain
# folder with kill -9 of the daemon at five random moments (override with
# TIERSTACK_CHURN_OPS, _KILLS, _SEED, _WORKERS). Needs root and /dev/fuse.
churn: build
	$(CARGO) test --release -p tierstack-cli --test cli_churn -- --ignored --nocapture churn_long_with_kills
