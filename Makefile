# dm-ckpt: top-level entry points. `make check` is the test command CI runs;
# `make demo` is the main job. Both install what they need first.

BUILD ?= build
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
export PYTHONPATH := $(CURDIR)/$(BUILD)/python

.PHONY: all deps configure check demo bench clean check-unit check-asan kmod check-vm vm-shell bench-vm \
	crash-campaign crash-campaign-userspace

all: configure
	cmake --build $(BUILD) -j$(JOBS)

deps:
	scripts/deps.sh

configure: $(BUILD)/CMakeCache.txt

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(PYTHON)

# The userspace tests (ctest), the same without Python under ASan+UBSan, then
# the kernel target's VM suite; -k: each runs even if one before failed, and
# any failing fails check.
check: deps
	$(MAKE) all
	$(MAKE) -k -j1 check-unit check-asan check-vm

check-unit:
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The library, tools and unit tests built with -fsanitize=address,undefined
# in $(ASAN_BUILD); any sanitizer report fails (scripts/check-asan.sh).
ASAN_BUILD ?= $(BUILD)-asan

check-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE=ON -DPython3_EXECUTABLE=$(PYTHON)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	scripts/check-asan.sh $(ASAN_BUILD) -j$(JOBS)

# The long crash enumeration (tests/crash/README.md): a longer trace on both
# dtypes and both models, more sampled subsets per crash point, tears at
# every sector and a resumed step from every state. The CKPT_CRASH_*
# variables override each part (CKPT_CRASH_SEED picks another trace).
CKPT_CRASH_STEPS ?= 20
CKPT_CRASH_EXHAUSTIVE ?= 10
CKPT_CRASH_SAMPLES ?= 256
CKPT_CRASH_TORN_ALL ?= 1
CKPT_CRASH_RESUME_EVERY ?= 1
CKPT_CRASH_SEED ?= 1

crash-campaign: crash-campaign-userspace

crash-campaign-userspace:
	$(MAKE) all
	set -e; for model in small wide; do for dtype in fp16 bf16; do \
		CKPT_CRASH_STEPS=$(CKPT_CRASH_STEPS) CKPT_CRASH_EXHAUSTIVE=$(CKPT_CRASH_EXHAUSTIVE) \
		CKPT_CRASH_SAMPLES=$(CKPT_CRASH_SAMPLES) CKPT_CRASH_TORN_ALL=$(CKPT_CRASH_TORN_ALL) \
		CKPT_CRASH_RESUME_EVERY=$(CKPT_CRASH_RESUME_EVERY) CKPT_CRASH_SEED=$(CKPT_CRASH_SEED) \
		$(BUILD)/tests/crash_test $$dtype $$model; done; done

demo: deps
	$(MAKE) all
	$(PYTHON) demo/train.py

bench: deps
	$(MAKE) all
	scripts/bench.sh $(BUILD)

# kmod's clean also removes the core objects Kbuild leaves in libckpt/core.
clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
	-$(MAKE) -C kmod clean

# --- the kernel target in Debian's kernels under qemu (scripts/vm/README.md) ---
# KERNEL: 6.1 or 6.12 (or a full version in /lib/modules); VM_CPU: max or qemu64.
KERNEL ?= 6.1
VM_CPU ?= max

# dm-ckpt.ko for every installed kernel with headers, kept in $(BUILD)/kmod/KVER/
kmod:
	BUILD=$(BUILD) scripts/vm/build-kmod.sh

# every tests/kmod program and the byte-identity check, for each kernel/CPU of
# CKPT_VM_MATRIX (default "6.1:max 6.1:qemu64 6.12:max 6.12:qemu64")
check-vm: deps
	$(MAKE) all
	$(MAKE) kmod
	BUILD=$(BUILD) scripts/vm/tests.sh

# an interactive shell in the VM (dm-ckpt loaded if it builds); IMAGE=file to
# back /dev/nvme0n1 with it. Ctrl-A X quits qemu.
vm-shell:
	$(MAKE) all
	-BUILD=$(BUILD) scripts/vm/build-kmod.sh $(KERNEL)
	BUILD=$(BUILD) scripts/vm/run --shell --kernel $(KERNEL) --cpu $(VM_CPU) --ckpt auto $(if $(IMAGE),--image $(IMAGE))

# fio's raw bandwidth of the emulated NVMe and the target's update rate over
# the same device, in one VM run; prints the ratio
bench-vm: deps
	$(MAKE) all
	BUILD=$(BUILD) scripts/vm/build-kmod.sh $(KERNEL)
	BUILD=$(BUILD) scripts/vm/bench.sh --kernel $(KERNEL) --cpu $(VM_CPU)
