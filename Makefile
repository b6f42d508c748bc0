# Build the dynamic module against Debian's nginx-dev, out of tree, in build/.
#   make            build build/ngx_http_idempotency_module.so
#   make test       build everything and run the prove suite
#   make demo       build, start Redis + nginx + a demo upstream, show a replay

NGX_SRC   ?= /usr/share/nginx/src
BUILD     := $(CURDIR)/build
MODDIR    := $(CURDIR)/ngx_http_idempotency_module
CC        ?= cc
CFLAGS    ?= -g -O2 -Wall -Wextra -Wno-unused-parameter -Werror
PROVE     ?= prove

CORE_SRCS := $(MODDIR)/idem_jcs.c $(MODDIR)/idem_fingerprint.c \
             $(MODDIR)/idem_key.c $(MODDIR)/idem_record.c
CORE_HDRS := $(wildcard $(MODDIR)/idem_*.h)
NGX_SRCS  := $(wildcard $(MODDIR)/ngx_http_idempotency*.c) \
             $(wildcard $(MODDIR)/ngx_http_idempotency*.h)
SCRIPTS   := $(wildcard $(CURDIR)/redis-scripts/*.lua)
CORE_LIBS := -lcjson -lcrypto -lm

UNIT_SRCS := $(wildcard t/unit/test_*.c)
UNIT_BINS := $(patsubst t/unit/%.c,$(BUILD)/unit/%,$(UNIT_SRCS))
TOOLS     := $(BUILD)/idempotency-fingerprint

.PHONY: all module unit tools test demo clean

all: module unit tools

module: $(BUILD)/ngx_http_idempotency_module.so

# configure writes into its source tree, so it runs on a copy of nginx-dev's.
$(BUILD)/nginx-src/configure:
	rm -rf $(BUILD)/nginx-src
	mkdir -p $(BUILD)
	cp -a $(NGX_SRC) $(BUILD)/nginx-src

$(BUILD)/objs/Makefile: $(BUILD)/nginx-src/configure config $(SCRIPTS)
	cd $(BUILD)/nginx-src && bash -c '. ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" \
	        --add-dynamic-module=$(CURDIR) --builddir=$(BUILD)/objs' \
	    > $(BUILD)/configure.log 2>&1 || { tail -20 $(BUILD)/configure.log; exit 1; }

$(BUILD)/ngx_http_idempotency_module.so: $(BUILD)/objs/Makefile $(NGX_SRCS) $(CORE_SRCS) $(CORE_HDRS)
	$(MAKE) -C $(BUILD)/nginx-src -f $(BUILD)/objs/Makefile modules
	@# a new inode: running nginx processes keep the mapping they have
	cp $(BUILD)/objs/ngx_http_idempotency_module.so $@.tmp && mv -f $@.tmp $@

unit: $(UNIT_BINS)

$(BUILD)/unit/%: t/unit/%.c t/unit/tap.h $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(BUILD)/unit
	$(CC) $(CFLAGS) -I$(MODDIR) -It/unit -o $@ $< $(CORE_SRCS) $(CORE_LIBS)

tools: $(TOOLS)

$(BUILD)/idempotency-fingerprint: tools/idempotency-fingerprint.c $(CORE_SRCS) $(CORE_HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) -I$(MODDIR) -o $@ $< $(CORE_SRCS) $(CORE_LIBS)

test: all
	$(PROVE) t/

demo: all
	./demo/run

clean:
	rm -rf $(BUILD)
