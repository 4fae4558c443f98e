# dm-ckpt: top-level entry points. `make check` is the test command CI runs;
# `make demo` is the main job. Both install what they need first.

BUILD ?= build
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
export PYTHONPATH := $(CURDIR)/$(BUILD)/python

.PHONY: all deps configure check demo bench clean

all: configure
	cmake --build $(BUILD) -j$(JOBS)

deps:
	scripts/deps.sh

configure: $(BUILD)/CMakeCache.txt

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(PYTHON)

check: deps
	$(MAKE) all
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

demo: deps
	$(MAKE) all
	$(PYTHON) demo/train.py

bench: deps
	$(MAKE) all
	scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD)
