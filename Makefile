# dm-ckpt: top-level entry points. `make check` is the test command CI runs;
# `make demo` is the main job. Both install what they need first.

BUILD ?= build
PYTHON ?= /usr/bin/python3
# torch 2's interpreter: the venv of requirements.txt (scripts/venv.sh), which
# scripts/deps.sh makes for make check; the torch2_ tests run under it
TORCH2_PYTHON ?= $(shell scripts/venv.sh --python)
JOBS ?= $(shell nproc)
export PYTHONPATH := $(CURDIR)/$(BUILD)/python
# where every proof records its result for docs/reliability.md
export CKPT_RELIABILITY_BUILD := $(CURDIR)/$(BUILD)

.PHONY: all deps deps-userspace install check-dkms configure check reliability demo bench clean check-unit check-asan kmod check-vm \
	check-powercut check-logreplay check-aarch64 vm-shell bench-vm bench-stripe bench-e2e bench-q8 fuzz-build check-fuzz fuzz fuzz-corpus \
	check-tsan crash-campaign crash-campaign-userspace crash-campaign-kernel crash-campaign-ranks \
	crash-campaign-reshard \
	crash-campaign-vm crash-campaign-powercut crash-campaign-logreplay kernel-debug check-kdebug check-gpu

all: configure
	cmake --build $(BUILD) -j$(JOBS)

deps:
	scripts/deps.sh

# what the userspace build, its tests and `make demo` need (no kernels, qemu)
deps-userspace:
	scripts/deps.sh --userspace

configure: $(BUILD)/CMakeCache.txt

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(PYTHON) \
		-DCKPT_TORCH2_PYTHON=$(TORCH2_PYTHON)

# The userspace tests (ctest), the same under ASan+UBSan, a bounded run of
# every fuzz target, the engine's threads under TSan, then the kernel
# target's VM suite, power cuts and crash-state replay, and last the table of
# docs/reliability.md; -k: each runs even if one before failed, and any
# failing fails check.
check: deps
	$(MAKE) all
	$(MAKE) -k -j1 check-unit check-aarch64 check-asan check-fuzz check-tsan check-vm check-powercut check-logreplay reliability

check-unit:
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The library, tools and unit tests built with -fsanitize=address,undefined
# in $(ASAN_BUILD); any sanitizer report fails (scripts/check-asan.sh).
ASAN_BUILD ?= $(BUILD)-asan

check-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE=ON -DPython3_EXECUTABLE=$(PYTHON)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	scripts/check-asan.sh $(ASAN_BUILD) -j$(JOBS)

# The core's and the engine's GoogleTest programs cross-built for aarch64 in
# $(AARCH64_BUILD) (cmake/aarch64-linux-gnu.cmake) and run under qemu-user:
# the update loop's NEON and SVE builds checked against the x86-64 scalar
# results (UpdateGolden), and the engine's tests (labels core and engine).
# Only those two programs are built: the cross build of everything (the
# library and tools build too, `cmake --build $(AARCH64_BUILD)`) would cost
# make check minutes more. The exhaustive 2^32 conversion sweep runs natively
# only (check-unit): emulated it takes far too long.
AARCH64_BUILD ?= $(BUILD)-aarch64
AARCH64_CTEST_EXCLUDE ?= UpdateConv.F32ToLowExhaustiveDispatched

check-aarch64: deps
	cmake -S . -B $(AARCH64_BUILD) --toolchain $(CURDIR)/cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(AARCH64_BUILD) --target unit_tests engine_tests -j$(JOBS)
	cd $(AARCH64_BUILD) && ctest --output-on-failure -j$(JOBS) -L 'core|engine' -E '$(AARCH64_CTEST_EXCLUDE)'

# docs/reliability.md from the last results of every proof (each writes
# $(BUILD)/reliability/NAME.json); fails if a proof of this run lost data
reliability:
	scripts/reliability.py update --build $(BUILD) --check

# libFuzzer targets (tests/fuzz/README.md), built with clang in
# $(FUZZ_BUILD): check-fuzz runs each for FUZZ_CHECK_SECONDS from its seed
# corpus (every crash kept there is replayed), fuzz for FUZZ_SECONDS,
# keeping what it found in $(FUZZ_BUILD)/fuzz-corpus; fuzz-corpus rewrites
# the seeds with the project's encoders.
FUZZ_BUILD ?= $(BUILD)-fuzz
FUZZ_SECONDS ?= 300
FUZZ_CHECK_SECONDS ?= 10

fuzz-build:
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_FUZZ=ON \
		-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DPython3_EXECUTABLE=$(PYTHON)
	cmake --build $(FUZZ_BUILD) --target fuzz_all -j$(JOBS)

check-fuzz: fuzz-build
	scripts/check-fuzz.sh $(FUZZ_BUILD) $(FUZZ_CHECK_SECONDS)

fuzz: fuzz-build
	scripts/check-fuzz.sh --keep $(FUZZ_BUILD) $(FUZZ_SECONDS)

fuzz-corpus: fuzz-build
	$(FUZZ_BUILD)/tests/fuzz/fuzz_seeds tests/fuzz/corpus

# The engine's worker threads, the C ABI's handle table and the tools'
# concurrency runs under ThreadSanitizer, in $(TSAN_BUILD)
# (scripts/check-tsan.sh): any report fails.
TSAN_BUILD ?= $(BUILD)-tsan

check-tsan:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_TSAN=ON -DPython3_EXECUTABLE=$(PYTHON)
	cmake --build $(TSAN_BUILD) --target engine_tests capi_tests ckptctl ckpt-trace -j$(JOBS)
	scripts/check-tsan.sh $(TSAN_BUILD)

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

crash-campaign: crash-campaign-userspace crash-campaign-ranks crash-campaign-reshard crash-campaign-kernel

# sharded OffloadAdamW (2 ranks over gloo): RANK_KILLS random SIGKILLs of one
# rank or both, each restart resuming all ranks at one step, every finished
# run bit-identical to one device (tests/python/test_offload_shard.py; 200
# kills took 141 s here)
RANK_KILLS ?= 200
crash-campaign-ranks:
	$(MAKE) all
	rc=0; CKPT_SHARD_KILLS=$(RANK_KILLS) PYTHONPATH=$(BUILD)/python PYTHONDONTWRITEBYTECODE=1 \
		$(PYTHON) -m unittest discover -s tests/python -p test_offload_shard.py \
		-k test_kills_resume_at_one_step || rc=1; \
	scripts/reliability.py record --build $(BUILD) --name rank-kills \
		--what "sharded OffloadAdamW, 2 ranks over gloo, one rank or both SIGKILLed at random; every restart resumes all ranks at one step, every finished run bit-identical to one device" \
		--count $(RANK_KILLS) --unit kills --lost $$rc --target "make crash-campaign-ranks"; \
	scripts/reliability.py update --build $(BUILD); exit $$rc

# ckptctl reshard of 2 ranks' 8-bit images onto 3, SIGKILLed RESHARD_KILLS
# times at random moments: the old images unchanged, every new path that
# exists a complete image of its rank (tests/python/test_reshard.py)
RESHARD_KILLS ?= 200
crash-campaign-reshard:
	$(MAKE) all
	rc=0; CKPT_RESHARD_KILLS=$(RESHARD_KILLS) PYTHONPATH=$(BUILD)/python PYTHONDONTWRITEBYTECODE=1 \
		$(PYTHON) -m unittest discover -s tests/python -p test_reshard.py \
		-k test_killed_reshard || rc=1; \
	scripts/reliability.py record --build $(BUILD) --name reshard-kills \
		--what "ckptctl reshard of 2 ranks' 8-bit images onto 3, SIGKILLed at random; the old images unchanged, every new path that exists a complete image of its rank" \
		--count $(RESHARD_KILLS) --unit kills --lost $$rc --target "make crash-campaign-reshard"; \
	scripts/reliability.py update --build $(BUILD); exit $$rc

# the kernel's part, each piece its own row of docs/reliability.md: the VM
# suite on the kernels, CPU models and state layouts make check leaves out,
# CAMPAIGN_POWERCUTS power cuts of a longer trace on the other kernel and CPU
# model than make check's, and the log replay of a longer trace on both
# kernels. Measured on the shared 2-core machine: the VM suite 41 min, a
# power cut ~20 s (one boot; 40 took 13 min), a log replay of 24 steps 3 min.
CAMPAIGN_VM_MATRIX ?= 6.1:max 6.1:qemu64 6.12:qemu64 6.12:qemu64:8bit 6.1:qemu64:8bit-bf16 6.12:max:8bit-bf16
CAMPAIGN_POWERCUTS ?= 150
crash-campaign-kernel: crash-campaign-vm crash-campaign-powercut crash-campaign-logreplay

crash-campaign-vm:
	$(MAKE) all
	$(MAKE) kmod
	BUILD=$(BUILD) CKPT_VM_MATRIX="$(CAMPAIGN_VM_MATRIX)" CKPT_VM_RECORD_NAME=campaign-kernel-vm-suite \
		CKPT_VM_RECORD_TARGET="make crash-campaign-vm" scripts/vm/tests.sh || rc=$$?; \
	scripts/reliability.py update --build $(BUILD); exit $${rc:-0}

crash-campaign-powercut:
	$(MAKE) all
	$(MAKE) kmod
	BUILD=$(BUILD) CKPT_VM_RECORD_NAME=campaign-kernel-power-cuts CKPT_VM_RECORD_TARGET="make crash-campaign-powercut" \
		scripts/vm/powercut.sh --cuts $(CAMPAIGN_POWERCUTS) --params 65536 --steps 60 --kernel 6.1 --cpu qemu64 || rc=$$?; \
	scripts/reliability.py update --build $(BUILD); exit $${rc:-0}

crash-campaign-logreplay:
	$(MAKE) all
	$(MAKE) kmod
	set -e; for k in 6.12 6.1; do \
		BUILD=$(BUILD) CKPT_VM_RECORD_NAME=campaign-kernel-log-replay-$$k \
			CKPT_VM_RECORD_TARGET="make crash-campaign-logreplay" \
			scripts/vm/logreplay.sh --steps 24 --kernel $$k || rc=$$?; \
	done; scripts/reliability.py update --build $(BUILD); exit $${rc:-0}

crash-campaign-userspace:
	$(MAKE) all
	for model in small wide; do for dtype in fp16 bf16; do \
		CKPT_CRASH_STEPS=$(CKPT_CRASH_STEPS) CKPT_CRASH_EXHAUSTIVE=$(CKPT_CRASH_EXHAUSTIVE) \
		CKPT_CRASH_SAMPLES=$(CKPT_CRASH_SAMPLES) CKPT_CRASH_TORN_ALL=$(CKPT_CRASH_TORN_ALL) \
		CKPT_CRASH_RESUME_EVERY=$(CKPT_CRASH_RESUME_EVERY) CKPT_CRASH_SEED=$(CKPT_CRASH_SEED) \
		sh tests/crash/record.sh $(BUILD)/tests/crash_test $$dtype $$model "make crash-campaign-userspace" \
			campaign-crash-engine-$$dtype-$$model || rc=1; done; done; \
	scripts/reliability.py update --build $(BUILD); exit $${rc:-0}

# The GPU checks (tests/gpu/check_gpu.py, torch 2's venv): OffloadAdamW on a
# CUDA model against itself without hooks and against torch's AdamW, and the
# GPU memory against torch's AdamW and DeepSpeed's ZeRO-Offload, recorded in
# docs/performance.md. Without a CUDA device it says so and exits 0.
check-gpu: deps
	$(MAKE) all
	$(TORCH2_PYTHON) tests/gpu/check_gpu.py

# under torch 2 where its venv is (make check made it), else Debian's torch
DEMO_PYTHON ?= $(if $(wildcard $(TORCH2_PYTHON)),$(TORCH2_PYTHON),$(PYTHON))

demo: deps-userspace
	$(MAKE) all
	$(DEMO_PYTHON) demo/train.py

bench: deps
	$(MAKE) all
	scripts/bench.sh $(BUILD)

# A training step end to end (bench/e2e_bench.py), under torch 2's venv:
# OffloadAdamW against torch's AdamW in RAM (fused, foreach, loop), the 8-bit
# AdamWs of bitsandbytes and torchao, DeepSpeed's ZeRO-Infinity and the
# project's own swap of the fp32 state to the same device, the demo's GPT at
# 10M, 50M and 200M params and at 2000 tensors, on /dev/shm and
# CKPT_BENCH_DISK (default /var/tmp); a table, build/bench/e2e.png and a JSON
# line. About an hour on 2 cores; E2E_ARGS=--quick for a smoke run.
E2E_ARGS ?=
bench-e2e: deps
	$(MAKE) all
	$(TORCH2_PYTHON) bench/e2e_bench.py --build $(BUILD) $(E2E_ARGS)

# The 8-bit states' quality against bitsandbytes' and torchao's 8-bit AdamW
# (bench/q8_quality.py): the demo's LM, 2000 steps, three seeds, held-out
# loss; hours on 2 cores. Q8_ARGS="--size tiny --steps 200" for a shorter run.
Q8_ARGS ?=
bench-q8: deps
	$(MAKE) all
	PYTHONPATH=$(BUILD)/python $(TORCH2_PYTHON) bench/q8_quality.py $(Q8_ARGS)

# The library, headers, ckpt.pc, ckptctl, ckpt-trace, the Python package, man
# pages and bash completion under PREFIX, staged under DESTDIR if given
# (README.md, "Install"); ldconfig for a real install. The kernel module is
# installed by DKMS (dkms.conf) or `make -C kmod install`.
PREFIX ?= /usr/local
DESTDIR ?=
install:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(PYTHON) \
		-DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD) --target ckpt ckptctl ckpt-trace ckpt_man -j$(JOBS)
	DESTDIR=$(DESTDIR) cmake --install $(BUILD)
	if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then ldconfig; fi

# DKMS builds dm-ckpt.ko for every installed kernel with headers, in a
# scratch DKMS tree (tests/install/test_dkms.sh); about 30 s of CPU a kernel.
check-dkms: deps
	sh tests/install/test_dkms.sh $(patsubst /usr/src/linux-headers-%,%,$(wildcard /usr/src/linux-headers-*-amd64))

# kmod's clean also removes the core objects Kbuild leaves in libckpt/core.
clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(TSAN_BUILD) $(AARCH64_BUILD)
	-$(MAKE) -C kmod clean

# --- the kernel target in Debian's kernels under qemu (scripts/vm/README.md) ---
# KERNEL: 6.1 or 6.12 (or a full version in /lib/modules); VM_CPU: max or qemu64.
KERNEL ?= 6.1
VM_CPU ?= max

# dm-ckpt.ko for every installed kernel with headers, kept in $(BUILD)/kmod/KVER/
kmod:
	BUILD=$(BUILD) scripts/vm/build-kmod.sh

# every tests/kmod program and the byte-identity check, for each kernel/CPU of
# CKPT_VM_MATRIX (default "6.1:max:8bit 6.12:max 6.12:qemu64:8bit-bf16": each
# state layout once; the crash campaign adds 6.1:qemu64 and more states)
check-vm: deps
	$(MAKE) all
	$(MAKE) kmod
	BUILD=$(BUILD) scripts/vm/tests.sh

# a 6.12 kernel with KASAN, lockdep, KFENCE, DEBUG_OBJECTS and
# DEBUG_ATOMIC_SLEEP, built from Debian's linux-source-6.12 into
# $(BUILD)/kdebug/HASH (scripts/vm/kdebug.sh; HASH of scripts/vm/kdebug.config)
kernel-debug:
	scripts/deps.sh --kernel-debug
	BUILD=$(BUILD) scripts/vm/kdebug.sh

# the kernel VM suite (scripts/vm/tests.sh) in that kernel, on the CPU models
# of KDEBUG_CPUS, with panic_on_warn and kasan.fault=panic; the result goes to
# the row kernel-debug of docs/reliability.md (regenerated). Not part of
# check: the build takes long and every test runs several times slower.
KDEBUG_CPUS ?= max
KDEBUG_TIMEOUT ?= 5400
check-kdebug: deps kernel-debug
	$(MAKE) all
	set -e; dir=$$(BUILD=$(BUILD) scripts/vm/kdebug.sh | tail -1); \
	BUILD=$(BUILD) scripts/vm/build-kmod.sh "$$dir"; \
	BUILD=$(BUILD) CKPT_VM_MATRIX="$(foreach c,$(KDEBUG_CPUS),$$dir:$(c))" \
		CKPT_VM_TIMEOUT=$(KDEBUG_TIMEOUT) \
		CKPT_VM_RUN_ARGS="--append kasan.fault=panic $(CKPT_VM_RUN_ARGS)" \
		CKPT_VM_RECORD_NAME=kernel-debug \
		CKPT_VM_RECORD_WHAT="debug kernel (KASAN, lockdep, KFENCE): the kernel target's VM suite in a 6.12 kernel with KASAN, PROVE_LOCKING, KFENCE, DEBUG_OBJECTS, DEBUG_ATOMIC_SLEEP, panic_on_warn, kasan.fault=panic" \
		CKPT_VM_RECORD_TARGET="make check-kdebug" scripts/vm/tests.sh || rc=$$?; \
	scripts/reliability.py update --build $(BUILD); exit $${rc:-0}

# qemu killed at random moments of steps under the kernel target; after each
# cut the image holds exactly the reference state of a committed step
# (scripts/vm/powercut.sh). POWERCUTS cuts (the campaign runs more).
POWERCUTS ?= 20
check-powercut: deps
	$(MAKE) all
	$(MAKE) kmod
	BUILD=$(BUILD) scripts/vm/powercut.sh --cuts $(POWERCUTS) --params 32768 --steps 24 --max-delay 4

# the kernel target's writes logged by dm-log-writes and replayed up to every
# flush and FUA: each state checked by the engine and the target
# (scripts/vm/logreplay.sh)
check-logreplay: deps
	$(MAKE) all
	$(MAKE) kmod
	BUILD=$(BUILD) scripts/vm/logreplay.sh

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

# one optimizer device over 1, 2 and 4 drives (dm-stripe of emulated NVMe
# namespaces, each throttled to 4 MB/s so the drives bound a step): the kernel
# target's and the engine's steps/s and their scaling (docs/performance.md,
# "Many drives"; about 2 minutes)
bench-stripe: deps
	$(MAKE) all
	BUILD=$(BUILD) scripts/vm/build-kmod.sh 6.12
	BUILD=$(BUILD) scripts/vm/stripe-bench.sh --kernel 6.12
