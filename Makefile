# The README's test command is `make test`.
CARGO ?= cargo
SHELL := /bin/bash

.PHONY: build test lint fuzz demo churn churn-client install uninstall deb rpm

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

# The same long round with every worker's calls made through the interception client
# (`tierstack exec`, issue 39): 20,000 operations, five kill -9 of the daemon.
churn-client: build
	TIERSTACK_CHURN_OPS=$${TIERSTACK_CHURN_OPS:-20000} TIERSTACK_CHURN_KILLS=$${TIERSTACK_CHURN_KILLS:-5} \
	  $(CARGO) test --release -p tierstack-cli --test cli_churn -- --exact --nocapture churn_under_the_interception_client

# ---- make install / make uninstall (issue 38) ----------------------------------------------
# make install [PREFIX=/usr/local] [DESTDIR=]: the stripped binary and shim, their debug info
# split out (objcopy --only-keep-debug, found through .gnu_debuglink), the man pages and the
# bash, zsh and fish completions that the binary itself writes (`tierstack gen-docs`), the
# SLURM files and the Grafana dashboard, the systemd units and the drop-ins of
# contrib/{tmpfiles.d,sysusers.d,udev,sysctl.d} (installed, not applied: each file says how).
# It installs the release build as it is: cargo runs only when a source is newer than it
# (`make` first, as yourself, then `sudo make install`). BIN= and PRELOAD= install other
# files as they are (nothing is built). It writes the list of what it installed to
# $(MANIFEST); `make uninstall` (the same PREFIX and DESTDIR) removes exactly those files and
# the manifest. LIBDIR=$(PREFIX)/lib64 gives a lib64 layout:
# the binary finds the shim in ../lib/tierstack and ../lib64/tierstack.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
DEBUGDIR ?= $(PREFIX)/lib/debug
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
ZSHCOMPDIR ?= $(DATADIR)/zsh/site-functions
FISHCOMPDIR ?= $(DATADIR)/fish/vendor_completions.d
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
# The drop-ins (the tierstack group, its udev rule, the runtime folders, the userfaultfd
# sysctl, documented): where systemd and udev read a package's (PREFIX=/usr: /usr/lib/...;
# /usr/local/lib/... is read too).
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
UDEVRULESDIR ?= $(PREFIX)/lib/udev/rules.d
SYSCTLDIR ?= $(PREFIX)/lib/sysctl.d
MANIFEST = $(DATADIR)/tierstack/installed-files
INSTALL ?= install
OBJCOPY ?= objcopy
# What is installed (cargo's release build; $CARGO_TARGET_DIR is followed as cargo follows
# it), and where it is prepared (stripped files, debug files, pages, completions).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BIN ?= $(TARGET_DIR)/release/tierstack
PRELOAD ?= $(TARGET_DIR)/release/libtierstack_preload.so
IOLIB ?= $(TARGET_DIR)/release/libtierstack_io.so
DIST ?= $(TARGET_DIR)/dist
SLURM_FILES = $(wildcard contrib/slurm/*)
GRAFANA_FILES = contrib/grafana/tierstack.json
UNIT_FILES = $(wildcard contrib/systemd/*.service)
TMPFILES_FILES = $(wildcard contrib/tmpfiles.d/*.conf)
SYSUSERS_FILES = $(wildcard contrib/sysusers.d/*.conf)
UDEV_FILES = $(wildcard contrib/udev/*.rules)
SYSCTL_FILES = $(wildcard contrib/sysctl.d/*.conf)

ifeq ($(origin BIN)$(origin PRELOAD),filefile)
# The release build is made again only when one of its sources is newer than it: the files
# cargo lists in its dep-info (`.d`, every source and include_str! file, the git HEAD of
# build.rs) and the manifests. A file since deleted is left out (the change that deleted it
# is newer anyway). Cargo leaves a file it found fresh as it was: the touch records that it is
# up to date, so the next `make install` does not ask cargo again.
cargo_deps = $(wildcard $(shell sed -e 's/^[^:]*://' -e 's/\\$$//' $(1) 2>/dev/null))
MANIFESTS = Cargo.toml Cargo.lock $(wildcard crates/*/Cargo.toml)
$(BIN): $(MANIFESTS) $(call cargo_deps,$(BIN:=.d))
	$(CARGO) build --release
	touch -c $@
$(PRELOAD): $(MANIFESTS) $(call cargo_deps,$(basename $(PRELOAD)).d)
	$(CARGO) build --release
	touch -c $@
endif
ifeq ($(origin IOLIB),file)
$(IOLIB): $(MANIFESTS) $(call cargo_deps,$(basename $(IOLIB)).d)
	$(CARGO) build --release
	touch -c $@
endif

# The debug info alone (--only-keep-debug), and a stripped copy that names it (.gnu_debuglink,
# with its CRC); the symbol table stays, so a backtrace names functions without the debug file.
HAVE_OBJCOPY = @command -v $(OBJCOPY) >/dev/null || { echo "make install: $(OBJCOPY) not found: install binutils" >&2; exit 1; }
$(DIST)/tierstack.debug: $(BIN)
	$(HAVE_OBJCOPY)
	mkdir -p $(DIST) && $(OBJCOPY) --only-keep-debug $(BIN) $@
$(DIST)/tierstack: $(BIN) $(DIST)/tierstack.debug
	$(OBJCOPY) --strip-debug --add-gnu-debuglink=$(DIST)/tierstack.debug $(BIN) $@
$(DIST)/libtierstack_preload.so.debug: $(PRELOAD)
	$(HAVE_OBJCOPY)
	mkdir -p $(DIST) && $(OBJCOPY) --only-keep-debug $(PRELOAD) $@
$(DIST)/libtierstack_preload.so: $(PRELOAD) $(DIST)/libtierstack_preload.so.debug
	$(OBJCOPY) --strip-debug --add-gnu-debuglink=$(DIST)/libtierstack_preload.so.debug $(PRELOAD) $@
$(DIST)/libtierstack_io.so.debug: $(IOLIB)
	$(HAVE_OBJCOPY)
	mkdir -p $(DIST) && $(OBJCOPY) --only-keep-debug $(IOLIB) $@
$(DIST)/libtierstack_io.so: $(IOLIB) $(DIST)/libtierstack_io.so.debug
	$(OBJCOPY) --strip-debug --add-gnu-debuglink=$(DIST)/libtierstack_io.so.debug $(IOLIB) $@
# The pages and completions of this very binary.
$(DIST)/docs.stamp: $(BIN)
	rm -rf $(DIST)/man $(DIST)/completions
	$(BIN) gen-docs --man $(DIST)/man --completions $(DIST)/completions
	touch $@

# The systemd units, naming the installed binary.
$(DIST)/units.stamp: $(UNIT_FILES) Makefile
	rm -rf $(DIST)/systemd && mkdir -p $(DIST)/systemd
	for f in $(UNIT_FILES); do sed 's#@BINDIR@#$(BINDIR)#g' "$$f" >"$(DIST)/systemd/$${f##*/}"; done
	touch $@

install: $(DIST)/tierstack $(DIST)/libtierstack_preload.so $(DIST)/libtierstack_io.so $(DIST)/docs.stamp $(DIST)/units.stamp
	@set -e; list=$$(mktemp); trap 'rm -f "$$list"' EXIT; \
	put() { $(INSTALL) -D -m "$$1" "$$2" "$(DESTDIR)$$3"; echo "$$3" >>"$$list"; echo "  $(DESTDIR)$$3"; }; \
	put 755 $(DIST)/tierstack "$(BINDIR)/tierstack"; \
	put 644 $(DIST)/tierstack.debug "$(DEBUGDIR)$(BINDIR)/tierstack.debug"; \
	put 755 $(DIST)/libtierstack_preload.so "$(LIBDIR)/tierstack/libtierstack_preload.so"; \
	put 644 $(DIST)/libtierstack_preload.so.debug "$(DEBUGDIR)$(LIBDIR)/tierstack/libtierstack_preload.so.debug"; \
	put 755 $(DIST)/libtierstack_io.so "$(LIBDIR)/tierstack/libtierstack_io.so"; \
	put 644 $(DIST)/libtierstack_io.so.debug "$(DEBUGDIR)$(LIBDIR)/tierstack/libtierstack_io.so.debug"; \
	for f in $(DIST)/man/*.1; do put 644 "$$f" "$(MANDIR)/man1/$${f##*/}"; done; \
	put 644 $(DIST)/completions/tierstack.bash "$(BASHCOMPDIR)/tierstack"; \
	put 644 $(DIST)/completions/_tierstack "$(ZSHCOMPDIR)/_tierstack"; \
	put 644 $(DIST)/completions/tierstack.fish "$(FISHCOMPDIR)/tierstack.fish"; \
	for f in $(SLURM_FILES); do put 644 "$$f" "$(DATADIR)/tierstack/slurm/$${f##*/}"; done; \
	for f in $(GRAFANA_FILES); do put 644 "$$f" "$(DATADIR)/tierstack/grafana/$${f##*/}"; done; \
	for f in $(DIST)/systemd/*.service; do put 644 "$$f" "$(SYSTEMDUNITDIR)/$${f##*/}"; done; \
	for f in $(TMPFILES_FILES); do put 644 "$$f" "$(TMPFILESDIR)/$${f##*/}"; done; \
	for f in $(SYSUSERS_FILES); do put 644 "$$f" "$(SYSUSERSDIR)/$${f##*/}"; done; \
	for f in $(UDEV_FILES); do put 644 "$$f" "$(UDEVRULESDIR)/$${f##*/}"; done; \
	for f in $(SYSCTL_FILES); do put 644 "$$f" "$(SYSCTLDIR)/$${f##*/}"; done; \
	old="$(DESTDIR)$(MANIFEST)"; \
	if [ -f "$$old" ]; then grep -vxF -f "$$list" "$$old" | while read -r f; do rm -f "$(DESTDIR)$$f"; done; fi; \
	$(INSTALL) -D -m 644 "$$list" "$(DESTDIR)$(MANIFEST)"; \
	echo "installed $$(wc -l <"$$list") files under $(DESTDIR)$(PREFIX) (list: $(DESTDIR)$(MANIFEST))"

uninstall:
	@set -e; m="$(DESTDIR)$(MANIFEST)"; \
	if [ ! -f "$$m" ]; then echo "make uninstall: no $$m: nothing was installed with PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) (give make install's PREFIX and DESTDIR)" >&2; exit 1; fi; \
	n=0; while read -r f; do rm -f "$(DESTDIR)$$f"; n=$$((n + 1)); done <"$$m"; rm -f "$$m"; \
	for d in "$(DATADIR)/tierstack/slurm" "$(DATADIR)/tierstack/grafana" "$(DATADIR)/tierstack" \
		"$(LIBDIR)/tierstack" "$(DEBUGDIR)$(LIBDIR)/tierstack"; do rmdir "$(DESTDIR)$$d" 2>/dev/null || true; done; \
	echo "removed $$n files and $$m"

# ---- make deb / make rpm (issue 38, packages) ---------------------------------------------
# make deb: target/dist/tierstack_<version>_<arch>.deb, with dpkg-deb alone (no cargo-deb, no
# debhelper): the tree of `make install DESTDIR=$(DEB_ROOT) PREFIX=/usr` (the same build and
# the same BIN= PRELOAD= CARGO= as install) plus DEBIAN/control from contrib/debian/control.in.
# One maintainer script, contrib/debian/postinst: it makes the tierstack group and lets udev
# apply the rule; the systemd units are installed, not enabled, and the other drop-ins are
# installed, not applied. The install's installed-files list is left out (dpkg keeps the
# list: `dpkg -L tierstack`).
# make rpm: a binary-only RPM of the same build (contrib/rpm/tierstack.spec with
# tierstack_prebuilt, rpmbuild --nodeps since a Debian host has no RPM database of the build
# dependencies) in $(DIST); `rpmbuild -bb contrib/rpm/tierstack.spec` with a source tarball
# builds from source instead.
VERSION := $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
DEB_ARCH = $(shell dpkg --print-architecture)
DEB_ROOT ?= $(DIST)/deb-root
DEB_MAINTAINER ?= tierstack developers <tierstack@localhost>
# xz: the smallest, and what every dpkg reads; zstd is 50 times faster (dpkg 1.21.18 and
# later: Debian 12, Ubuntu 21.10), which the test uses.
DEB_COMPRESS ?= xz
RPM_TOPDIR ?= $(DIST)/rpmbuild

deb:
	@command -v dpkg-deb >/dev/null || { echo "make deb: dpkg-deb not found (a Debian or Ubuntu host)" >&2; exit 1; }
	rm -rf $(DEB_ROOT)
	$(MAKE) --no-print-directory install DESTDIR=$(DEB_ROOT) PREFIX=/usr
	rm -f $(DEB_ROOT)/usr/share/tierstack/installed-files
	mkdir -p $(DEB_ROOT)/DEBIAN
	sed -e 's#@VERSION@#$(VERSION)#' -e 's#@ARCH@#$(DEB_ARCH)#' -e 's#@MAINTAINER@#$(DEB_MAINTAINER)#' \
		-e "s#@INSTALLED_SIZE@#$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1)#" \
		contrib/debian/control.in >$(DEB_ROOT)/DEBIAN/control
	install -m 0755 contrib/debian/postinst $(DEB_ROOT)/DEBIAN/postinst
	dpkg-deb -Z$(DEB_COMPRESS) --build --root-owner-group $(DEB_ROOT) $(DIST)/tierstack_$(VERSION)_$(DEB_ARCH).deb

rpm: $(BIN) $(PRELOAD) $(IOLIB)
	@command -v rpmbuild >/dev/null || { echo "make rpm: rpmbuild not found (apt-get install rpm, dnf install rpm-build)" >&2; exit 1; }
	rm -rf $(RPM_TOPDIR)
	rpmbuild -bb --nodeps --define "_topdir $(abspath $(RPM_TOPDIR))" \
		--define "tierstack_prebuilt 1" --define "tierstack_srcdir $(CURDIR)" \
		--define "tierstack_bin $(abspath $(BIN))" --define "tierstack_preload $(abspath $(PRELOAD))" \
		--define "tierstack_iolib $(abspath $(IOLIB))" \
		contrib/rpm/tierstack.spec
	cp $(RPM_TOPDIR)/RPMS/*/tierstack-*.rpm $(DIST)/
	ls -l $(DIST)/tierstack-*.rpm
