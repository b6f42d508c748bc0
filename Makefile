# Build the dynamic module against Debian's nginx-dev, out of tree, in build/.
#   make            build build/ngx_http_idempotency_module.so
#   make test       build everything and run the prove suite
#   make demo       build, start Redis + nginx + a demo upstream, show a replay
#   make deb        the Debian packages (debian/), unsigned, in build/deb/,
#                   then lintian (fails on errors only)
#   make test-nginx NGINX_ARCHIVE=t/data/nginx/nginx-1.31.4.tar.gz
#                   nginx and the module built from an nginx source archive
#                   (build/nginx-<version>/), then the suite against them

# rules with prerequisites come before 'all' (per-target variables of the
# unit tests): say which goal a bare 'make' builds
.DEFAULT_GOAL := all

NGX_SRC   ?= /usr/share/nginx/src
BUILD     := $(CURDIR)/build
MODDIR    := $(CURDIR)/ngx_http_idempotency_module
CC        ?= cc
CFLAGS    ?= -g -O2 -Wall -Wextra -Wno-unused-parameter -Werror
PROVE     ?= prove

CORE_SRCS := $(MODDIR)/idem_text.c $(MODDIR)/idem_number.c \
             $(MODDIR)/idem_jcs_parse.c $(MODDIR)/idem_jcs.c \
             $(MODDIR)/idem_fingerprint.c $(MODDIR)/idem_key.c \
             $(MODDIR)/idem_record.c $(MODDIR)/idem_reply.c \
             $(MODDIR)/idem_pointer.c $(MODDIR)/idem_jws.c \
             $(MODDIR)/idem_json.c $(MODDIR)/idem_slot.c \
             $(MODDIR)/idem_audit.c $(MODDIR)/idem_answer.c \
             $(MODDIR)/idem_audit_file.c \
             $(MODDIR)/idem_html.c
CORE_HDRS := $(wildcard $(MODDIR)/idem_*.h)
NGX_SRCS  := $(wildcard $(MODDIR)/ngx_http_idempotency*.c) \
             $(wildcard $(MODDIR)/ngx_http_idempotency*.h)
SCRIPTS   := $(wildcard $(CURDIR)/redis-scripts/*.lua)
CORE_LIBS := -lcjson -lcrypto -lm

UNIT_SRCS := $(wildcard t/unit/test_*.c)
UNIT_BINS := $(patsubst t/unit/%.c,$(BUILD)/unit/%,$(UNIT_SRCS))
UNIT_LIBS := $(CORE_LIBS)

# test support, not in the module: the unit tests and the fuzzers link it
TEST_SRCS := t/unit/jcs_tree.c
TEST_HDRS := t/unit/jcs_tree.h t/unit/mem_sink.h t/unit/tap.h

# the cross-check with a second parser (Debian's libjansson-dev)
$(BUILD)/unit/test_jansson: UNIT_LIBS += -ljansson

# the retry rule of the tools (tools/call_policy.c) against docs/agents.md
$(BUILD)/unit/test_call_policy: UNIT_EXTRA = tools/call_policy.c
$(BUILD)/unit/test_call_policy: tools/call_policy.c tools/call_policy.h
TOOLS     := $(BUILD)/idempotency-fingerprint $(BUILD)/idempotency-call \
             $(BUILD)/idempotency-approve $(BUILD)/idempotency-audit \
             $(BUILD)/idempotency-mcp

.PHONY: all module unit tools test test-nginx demo deb clean FORCE

all: module unit tools

module: $(BUILD)/ngx_http_idempotency_module.so

# configure writes into its source tree, so it runs on a copy of nginx-dev's.
$(BUILD)/nginx-src/configure:
	rm -rf $(BUILD)/nginx-src
	mkdir -p $(BUILD)
	cp -a $(NGX_SRC) $(BUILD)/nginx-src

$(BUILD)/objs/Makefile: $(BUILD)/nginx-src/configure config $(SCRIPTS) $(MODDIR)/idem_record.h
	cd $(BUILD)/nginx-src && bash -c '. ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" \
	        --add-dynamic-module=$(CURDIR) --builddir=$(BUILD)/objs' \
	    > $(BUILD)/configure.log 2>&1 || { tail -20 $(BUILD)/configure.log; exit 1; }

$(BUILD)/ngx_http_idempotency_module.so: $(BUILD)/objs/Makefile $(NGX_SRCS) $(CORE_SRCS) $(CORE_HDRS)
	$(MAKE) -C $(BUILD)/nginx-src -f $(BUILD)/objs/Makefile modules
	@# a new inode: running nginx processes keep the mapping they have
	cp $(BUILD)/objs/ngx_http_idempotency_module.so $@.tmp && mv -f $@.tmp $@

unit: $(UNIT_BINS)

$(BUILD)/unit/%: t/unit/%.c $(TEST_SRCS) $(TEST_HDRS) $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS) -I$(MODDIR) -It/unit -Itools -o $@ $< $(UNIT_EXTRA) $(TEST_SRCS) \
	    $(CORE_SRCS) $(UNIT_LIBS)

tools: $(TOOLS)

$(BUILD)/idempotency-fingerprint: tools/idempotency-fingerprint.c $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(CPPFLAGS) -I$(MODDIR) -o $@ $< $(CORE_SRCS) $(LDFLAGS) $(CORE_LIBS)

# of the core only the JWS signer, the one the module verifies with (and
# the pointers, text layer and canonical JSON it shows a proposal with);
# libcurl for --endpoint
APPROVE_CORE := $(MODDIR)/idem_jws.c $(MODDIR)/idem_pointer.c $(MODDIR)/idem_text.c \
                $(MODDIR)/idem_json.c $(MODDIR)/idem_jcs.c $(MODDIR)/idem_jcs_parse.c \
                $(MODDIR)/idem_number.c $(MODDIR)/idem_html.c
$(BUILD)/idempotency-approve: tools/idempotency-approve.c $(APPROVE_CORE) $(CORE_HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(CPPFLAGS) -I$(MODDIR) $(shell pkg-config --cflags libcurl) -o $@ $< \
	    $(APPROVE_CORE) $(LDFLAGS) $(shell pkg-config --libs libcurl) -lcjson -lcrypto -lm

# hiredis' blocking API reads the stream; of the core the audit entries,
# the record's netstrings, the text layer and the key files of idem_jws.c
AUDIT_CORE := $(MODDIR)/idem_audit.c $(MODDIR)/idem_audit_file.c \
              $(MODDIR)/idem_record.c \
              $(MODDIR)/idem_fingerprint.c $(MODDIR)/idem_jcs.c \
              $(MODDIR)/idem_jcs_parse.c $(MODDIR)/idem_number.c \
              $(MODDIR)/idem_pointer.c $(MODDIR)/idem_jws.c \
              $(MODDIR)/idem_text.c
$(BUILD)/idempotency-audit: tools/idempotency-audit.c $(AUDIT_CORE) $(CORE_HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(CPPFLAGS) -I$(MODDIR) -o $@ $< $(AUDIT_CORE) $(LDFLAGS) \
	    -lhiredis $(CORE_LIBS)

# libcurl (libcurl4-openssl-dev) for HTTP; of the core the text layer and
# the answer table (the retry rule classifies from it).
# CALL_SRCS are shared with idempotency-mcp: the state files, one HTTP
# attempt, the retry rule and its loop (docs/agents.md).
CALL_SRCS := tools/call_state.c tools/call_http.c tools/call_policy.c tools/call_run.c \
             $(MODDIR)/idem_answer.c
CALL_HDRS := tools/call_state.h tools/call_http.h tools/call_policy.h tools/call_run.h \
             $(MODDIR)/idem_answer.h
CURL_CFLAGS = $(shell pkg-config --cflags libcurl)
CURL_LIBS = $(shell pkg-config --libs libcurl)
$(BUILD)/idempotency-call: tools/idempotency-call.c $(CALL_SRCS) $(CALL_HDRS) $(MODDIR)/idem_text.c $(MODDIR)/idem_text.h
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(CPPFLAGS) -I$(MODDIR) -Itools $(CURL_CFLAGS) -o $@ $< \
	    $(CALL_SRCS) $(MODDIR)/idem_text.c $(LDFLAGS) $(CURL_LIBS) -lcjson -lcrypto

# the MCP server: the same call files, plus JSON-RPC over stdio (mcp_rpc),
# its configuration (mcp_config) and its tools (mcp_tools, mcp_request)
MCP_SRCS := tools/mcp_rpc.c tools/mcp_config.c tools/mcp_tools.c tools/mcp_request.c
MCP_HDRS := tools/mcp_rpc.h tools/mcp_config.h tools/mcp_tools.h
$(BUILD)/idempotency-mcp: tools/idempotency-mcp.c $(MCP_SRCS) $(MCP_HDRS) $(CALL_SRCS) $(CALL_HDRS) \
                          $(MODDIR)/idem_text.c $(MODDIR)/idem_text.h
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(CPPFLAGS) -pthread -I$(MODDIR) -Itools $(CURL_CFLAGS) -o $@ $< \
	    $(MCP_SRCS) $(CALL_SRCS) $(MODDIR)/idem_text.c $(LDFLAGS) -pthread $(CURL_LIBS) \
	    -lcjson -lcrypto

# Test files run in parallel: each has its own prefix and ports (t/lib).
# The suite waits on nginx, Redis and the upstream more than it computes, so
# a 2-core machine keeps 4 files busy: 3.5 min instead of 8.5 (docs/building.md).
PROVE_JOBS ?= 4
# the longest files (40-80 s each) start first, so that none of them is the
# last to finish; then the rest in order
TESTS_SLOW := $(filter $(wildcard t/*.t), t/56-cluster.t t/44-sentinel.t \
              t/46-fingerprint-exclude.t t/41-redis-stall.t)
TESTS      := $(TESTS_SLOW) $(filter-out $(TESTS_SLOW),$(sort $(wildcard t/*.t)))

# the JavaScript clients of the tests (t/mcp: the MCP SDK, t/browser:
# playwright-core), pinned by their package-lock.json
NODE_DEPS := t/mcp/node_modules/.package-lock.json \
             t/browser/node_modules/.package-lock.json

%/node_modules/.package-lock.json: %/package-lock.json %/package.json
	cd $* && npm ci --no-audit --no-fund

test: all $(NODE_DEPS)
	$(PROVE) -j$(PROVE_JOBS) --timer $(TESTS)

demo: all
	./demo/run

# ---------------------------------------------------------------- nginx.org
# The module built with nginx's own build (its gcc flags include -Werror)
# from a source archive of nginx (git archive of a release tag, so
# ./auto/configure), with the nginx binary, then the suite against both.
# The flags beyond --with-compat are those the suite's configurations use:
# thread_pool, listen ... http2, stub_status, and debug-level log lines
# that some tests read (docs/building.md).
NGINX_ARCHIVE ?= t/data/nginx/nginx-1.31.4.tar.gz
NGINX_VERSION := $(patsubst nginx-%.tar.gz,%,$(notdir $(NGINX_ARCHIVE)))
NGINX_DIR     := $(BUILD)/nginx-$(NGINX_VERSION)
NGINX_CONFIGURE := --with-compat --with-threads --with-http_ssl_module \
                   --with-http_v2_module --with-http_stub_status_module --with-debug

$(NGINX_DIR)/auto/configure: $(NGINX_ARCHIVE)
	rm -rf $(NGINX_DIR)
	mkdir -p $(BUILD)
	tar -C $(BUILD) -xzf $(NGINX_ARCHIVE)
	@test -x $@ || { echo "$(NGINX_ARCHIVE) did not unpack into $(NGINX_DIR)"; exit 1; }
	touch $@

# rewritten only when the flags change, so that an edit elsewhere in this
# Makefile does not rebuild nginx
$(NGINX_DIR)/configure.flags: $(NGINX_DIR)/auto/configure FORCE
	@echo '$(NGINX_CONFIGURE)' | cmp -s - $@ || echo '$(NGINX_CONFIGURE)' > $@

$(NGINX_DIR)/objs/Makefile: $(NGINX_DIR)/configure.flags config $(SCRIPTS) $(MODDIR)/idem_record.h
	cd $(NGINX_DIR) && ./auto/configure $(NGINX_CONFIGURE) \
	    --add-dynamic-module=$(CURDIR) --builddir=$(NGINX_DIR)/objs \
	    > $(NGINX_DIR)/configure.log 2>&1 || { tail -20 $(NGINX_DIR)/configure.log; exit 1; }
	@grep -q -- '-Werror' $@ || { echo "nginx's build does not use -Werror"; exit 1; }

# next to the binary's objs/, as build/ has it: t/lib reads objs/redis-scripts
$(NGINX_DIR)/ngx_http_idempotency_module.so: $(NGINX_DIR)/objs/Makefile $(NGX_SRCS) $(CORE_SRCS) $(CORE_HDRS)
	$(MAKE) -C $(NGINX_DIR) -f $(NGINX_DIR)/objs/Makefile binary modules
	cp $(NGINX_DIR)/objs/ngx_http_idempotency_module.so $@.tmp && mv -f $@.tmp $@

test-nginx: $(NGINX_DIR)/ngx_http_idempotency_module.so unit tools $(NODE_DEPS)
	$(NGINX_DIR)/objs/nginx -V
	IDEM_NGINX=$(NGINX_DIR)/objs/nginx IDEM_MODULE=$(NGINX_DIR)/ngx_http_idempotency_module.so \
	    $(PROVE) -j$(PROVE_JOBS) --timer $(TESTS)

# dpkg-buildpackage writes its results next to the source tree, so it runs
# on a copy in build/deb/src: the packages land in build/deb/, nothing
# outside the repository is touched, and the tree itself stays clean.
DEB_SRC := $(BUILD)/deb/src/ngx-http-idempotency

deb:
	rm -rf $(BUILD)/deb
	mkdir -p $(DEB_SRC)
	tar -C $(CURDIR) --exclude=./build --exclude=./build-asan --exclude=./.git \
	    --exclude='./obj-*' -cf - . | tar -C $(DEB_SRC) -xf -
	cd $(DEB_SRC) && dpkg-buildpackage -us -uc -b
	mv $(BUILD)/deb/src/*.deb $(BUILD)/deb/src/*.changes $(BUILD)/deb/src/*.buildinfo \
	    $(BUILD)/deb/
	lintian --fail-on error $(BUILD)/deb/*.changes
	@ls -l $(BUILD)/deb/*.deb

clean:
	rm -rf $(BUILD)

# ---------------------------------------------------------------- hardening
#   make test-asan       the module built with ASan+UBSan (build-asan/), loaded
#                        into the stock nginx with the runtimes preloaded; the
#                        whole t/ suite with IDEM_SANITIZE=1 (any sanitizer
#                        report fails), then the core unit tests built with
#                        the same sanitizers (leak detection on)
#   make valgrind-check  nginx (master_process off) under valgrind memcheck
#                        for a few requests: tools/valgrind-nginx
#   make fuzz            each libFuzzer target for FUZZ_SECONDS (default 60)
#   make fuzz-ci         each for 30 s (what .ci/run runs)

ASAN_BUILD   := $(CURDIR)/build-asan
ASAN_MODULE  := $(ASAN_BUILD)/ngx_http_idempotency_module.so
ASAN_CFLAGS  := -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined -fPIC
ASAN_LDFLAGS := -fsanitize=address,undefined -Wl,-z,relro -Wl,-z,now -fPIC
ASAN_UNIT    := $(patsubst t/unit/%.c,$(ASAN_BUILD)/unit/%,$(UNIT_SRCS))
ASAN_RUN_ENV := ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

FUZZ_CC      ?= clang
FUZZ_CFLAGS  ?= -g -O1 -fno-omit-frame-pointer \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -Wall -Wextra -Wno-unused-parameter -Wno-unused-function
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := jcs fingerprint key record claim jws audit html
FUZZ_BINS    := $(patsubst %,$(ASAN_BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))

.PHONY: module-asan unit-asan test-asan valgrind-check fuzz-build fuzz fuzz-ci clean-hardening

module-asan: $(ASAN_MODULE)

$(ASAN_BUILD)/nginx-src/configure:
	rm -rf $(ASAN_BUILD)/nginx-src
	mkdir -p $(ASAN_BUILD)
	cp -a $(NGX_SRC) $(ASAN_BUILD)/nginx-src

# Debian's flags plus the sanitizers; configure runs (and links) its feature
# tests with them, hence ASAN_OPTIONS for those little programs.
$(ASAN_BUILD)/objs/Makefile: $(ASAN_BUILD)/nginx-src/configure config $(SCRIPTS) $(MODDIR)/idem_record.h
	cd $(ASAN_BUILD)/nginx-src && ASAN_OPTIONS=detect_leaks=0 bash -c '. ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" \
	        --with-cc-opt="$(ASAN_CFLAGS)" --with-ld-opt="$(ASAN_LDFLAGS)" \
	        --add-dynamic-module=$(CURDIR) --builddir=$(ASAN_BUILD)/objs' \
	    > $(ASAN_BUILD)/configure.log 2>&1 || { tail -20 $(ASAN_BUILD)/configure.log; exit 1; }

$(ASAN_MODULE): $(ASAN_BUILD)/objs/Makefile $(NGX_SRCS) $(CORE_SRCS) $(CORE_HDRS)
	$(MAKE) -C $(ASAN_BUILD)/nginx-src -f $(ASAN_BUILD)/objs/Makefile modules
	cp $(ASAN_BUILD)/objs/ngx_http_idempotency_module.so $@.tmp && mv -f $@.tmp $@

unit-asan: $(ASAN_UNIT)

$(ASAN_BUILD)/unit/test_jansson: UNIT_LIBS += -ljansson
# (here, below ASAN_BUILD's definition: a target name is expanded where it is read)
$(ASAN_BUILD)/unit/test_call_policy: UNIT_EXTRA = tools/call_policy.c
$(ASAN_BUILD)/unit/test_call_policy: tools/call_policy.c tools/call_policy.h

$(ASAN_BUILD)/unit/%: t/unit/%.c $(TEST_SRCS) $(TEST_HDRS) $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(ASAN_BUILD)/unit
	$(CC) $(CFLAGS) $(ASAN_CFLAGS) -I$(MODDIR) -It/unit -Itools -o $@ $< $(UNIT_EXTRA) \
	    $(TEST_SRCS) $(CORE_SRCS) $(UNIT_LIBS)

# unit and tools too: t/0*.t run build/unit/* and build/idempotency-fingerprint.
# The suite runs here with idempotency_complete_beside on in every http{}
# (IDEM_COMPLETE_BESIDE, t/lib), so that the sanitizers watch its native
# completion too, and CI runs the suite once with each setting.
test-asan: $(ASAN_MODULE) $(ASAN_UNIT) unit tools $(NODE_DEPS)
	IDEM_MODULE=$(ASAN_MODULE) IDEM_SANITIZE=1 IDEM_COMPLETE_BESIDE=on $(PROVE) -j$(PROVE_JOBS) --timer $(TESTS)
	@for u in $(ASAN_UNIT); do \
	    echo "== $$u (ASan+UBSan, leak detection on)"; \
	    $(ASAN_RUN_ENV) $$u t/data/jcs > $$u.tap 2>&1 \
	        || { grep -v '^ok' $$u.tap | tail -40; echo "FAILED: $$u"; exit 1; }; \
	    grep -c '^ok' $$u.tap | sed 's/^/   tests ok: /'; \
	done

valgrind-check: module
	tools/valgrind-nginx

fuzz-build: $(FUZZ_BINS)

$(ASAN_BUILD)/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h fuzz/fuzz_value.h $(TEST_SRCS) $(TEST_HDRS) \
                          $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(ASAN_BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) -I$(MODDIR) -It/unit -o $@ $< $(TEST_SRCS) \
	    $(CORE_SRCS) $(CORE_LIBS)

# The seeds in fuzz/corpus/<target> are read, new inputs go to
# build-asan/fuzz/corpus/<target>, crashes to build-asan/fuzz/crash-<target>-*.
fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(ASAN_BUILD)/fuzz/corpus/$$t; \
	    echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	    $(ASAN_RUN_ENV) $(ASAN_BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
	        -timeout=20 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
	        -artifact_prefix=$(ASAN_BUILD)/fuzz/crash-$$t- \
	        $(ASAN_BUILD)/fuzz/corpus/$$t fuzz/corpus/$$t \
	        > $(ASAN_BUILD)/fuzz/fuzz_$$t.log 2>&1 \
	        || { tail -60 $(ASAN_BUILD)/fuzz/fuzz_$$t.log; echo "FAILED: fuzz_$$t"; exit 1; }; \
	    grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' \
	        $(ASAN_BUILD)/fuzz/fuzz_$$t.log | sed 's/^/   /'; \
	done

fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=30

clean-hardening:
	rm -rf $(ASAN_BUILD)

clean: clean-hardening

# ---------------------------------------------------------------- bench
#   make bench           bench/run: the benchmarks against plain proxy_pass
#                        (bench/README.md); BENCH_FLAGS=--quick for a smoke run
.PHONY: bench
bench: module
	./bench/run --no-build $(BENCH_FLAGS)
