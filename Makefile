# The README's test command is `make test`.
CARGO ?= cargo

.PHONY: build test lint fuzz demo

build:
	$(CARGO) build --release

test: build
	$(CARGO) test --release --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --release -- -D warnings

demo: build
	./target/release/tierstack demo

fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run superblock -- -max_total_time=60
	cd fuzz && $(CARGO) +nightly fuzz run summary -- -max_total_time=60
