#!/bin/bash
# The VM test suite of the kernel target (make check-vm). For each kernel and
# CPU model of the matrix it boots Debian's kernel in qemu twice:
#   1. kmod tests: loads dm-ckpt and runs every tests/kmod program (TAP);
#   2. byte identity: an image formatted on the host by ckpt-trace is mapped
#      through dm-ckpt in the guest and the seeded trace is replayed on
#      /dev/mapper/ckpt, while the host replays the same trace on a copy with
#      the userspace engine; then the two images must be identical (cmp) and
#      the two traces' output too (diff). The trace rolls a committed step
#      back every --rollback-every steps (default 50; 0: never) and does it
#      again, through the ROLLBACK command on both targets.
# A crash, a kernel BUG/WARNING/Oops, a timeout or a missing program is a
# failure. The last line is "N passed, N failed"; the exit status is non-zero
# if anything failed.
#
#   scripts/vm/tests.sh [--matrix "6.1:max 6.1:qemu64 6.12:max:8bit"]
#                       [--params N] [--steps N] [--seed N] [--presteps N] [--state fp32|8bit|8bit-bf16]
#                       [--rollback-every N]
#                       [--only harness|kmod|identity|stripe|scripts|assembly|nvmeof|SCRIPT]
# --only SCRIPT: only the guest script tests/vm/SCRIPT.sh. stripe: the byte
# identity of dm-ckpt over a dm-stripe of 3 namespaces and the engine over its
# own stripe set of the same drives (once per suite).
# --presteps N: the host commits the first N steps (default 0) with the
# userspace engine before the image is copied; both sides then continue from
# step N+1 (so the kernel starts from a state the userspace engine wrote).
# --state 8bit: the byte identity image keeps 8-bit moments (feature Q8);
# 8bit-bf16 also bf16 masters (feature BF16M; that entry's dtype is bf16);
# a matrix entry KERNEL:CPU:STATE sets it for that entry alone.
# Environment: CKPT_VM_MATRIX, CKPT_VM_PARAMS, CKPT_VM_STEPS, CKPT_VM_SEED,
# CKPT_VM_PRESTEPS, CKPT_VM_STATE, CKPT_VM_ROLLBACK_EVERY,
# CKPT_VM_PROGRAMS (only these tests/kmod programs),
# CKPT_VM_EVERY_CPU=1 (run "// vm: cpu-independent" programs on every CPU
# model too, and "# vm: once" scripts in every -cpu max entry), CKPT_VM_TIMEOUT (per VM run), CKPT_VM_RUN_ARGS (extra options for
# scripts/vm/run, e.g. "--smp 4"), BUILD (build directory, default build),
# CKPT_VM_RECORD_NAME, CKPT_VM_RECORD_WHAT, CKPT_VM_RECORD_TARGET (the row of
# docs/reliability.md the result goes to; default kernel-vm-suite).
# A kernel of the matrix is 6.1, 6.12, a full version, or a kernel build
# directory (make kernel-debug's build/kdebug/HASH; scripts/vm/run --kernel).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# All of the script is one compound command, parsed before it runs: editing
# the file while a run is under way cannot derail that run.
{

# The default leaves out 6.1:qemu64: the SSE2 path is the same source on both
# kernels and 6.12:qemu64 runs it, which keeps make check within its budget;
# the crash campaign runs the whole matrix. Each entry's byte identity proves
# one state layout: 6.1:max the 8-bit moments (feature Q8), 6.12:max the fp32
# state, 6.12:qemu64 8-bit moments with bf16 masters (BF16M) on SSE2.
matrix=${CKPT_VM_MATRIX:-"6.1:max:8bit 6.12:max 6.12:qemu64:8bit-bf16"}
params=${CKPT_VM_PARAMS:-1000000}
steps=${CKPT_VM_STEPS:-200}
seed=${CKPT_VM_SEED:-}
presteps=${CKPT_VM_PRESTEPS:-0}
rollback_every=${CKPT_VM_ROLLBACK_EVERY:-50}
state=${CKPT_VM_STATE:-fp32}
only=""
while [ $# -gt 0 ]; do
	case $1 in
	--matrix) matrix=$2; shift 2 ;;
	--params) params=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	--seed) seed=$2; shift 2 ;;
	--presteps) presteps=$2; shift 2 ;;
	--rollback-every) rollback_every=$2; shift 2 ;;
	--state) state=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//'; exit 2 ;;
	*) echo "tests.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

RUN=$VM_DIR/run
read -r -a run_args <<<"${CKPT_VM_RUN_ARGS:-}"
TRACE=$BUILD_DIR/tools/ckpt-trace
results=$VM_CACHE/results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$results"
# keep the last 5 suites (images are kept for inspection: ~60 MB a kernel/CPU)
ls -1d "$VM_CACHE"/results/*/ 2>/dev/null | head -n -5 | xargs -r rm -rf

pass=0 fail=0 skip=0
failures=()
t0=$SECONDS

ok() { pass=$((pass + 1)); echo "ok - $*"; }
not_ok() { fail=$((fail + 1)); failures+=("$*"); echo "not ok - $*"; }
log() { echo "# $*"; }

# why RC: the runner's status as words
why() {
	case $1 in
	0) echo "passed" ;;
	2) echo "runner setup error" ;;
	122) echo "the kernel reported BUG/WARNING/Oops/panic" ;;
	123) echo "no exit marker: the guest crashed" ;;
	124) echo "timeout" ;;
	125) echo "guest setup failed (module load, NVMe, device-mapper)" ;;
	*) echo "script exit status $1" ;;
	esac
}

# runner_error FILE -> ": <the runner's error or setup failure>" if any
runner_error() {
	local e
	e=$(grep -aE '^vm: error: |CKPT-VM-ERROR' "$1" 2>/dev/null | head -1 |
		sed -e 's/^vm: error: //' -e 's/.*CKPT-VM-ERROR: //' -e 's/ ([0-9.]*s)$//')
	[ -z "$e" ] || echo ": $e"
}

# The test programs: the list CMake wrote; the sources are the truth.
programs=""
srcs=$(ls "$ROOT"/tests/kmod/*.c 2>/dev/null | wc -l)
if [ -f "$BUILD_DIR/tests/kmod/programs.txt" ]; then
	programs=$(tr '\n' ' ' <"$BUILD_DIR/tests/kmod/programs.txt")
fi
nprog=$(echo $programs | wc -w)

preflight_ok=1
if [ "$nprog" -lt "$srcs" ]; then
	not_ok "tests/kmod has $srcs program(s) but $nprog are configured in $BUILD/tests/kmod/programs.txt (run make all)"
fi
for p in $programs; do
	[ -x "$BUILD_DIR/tests/kmod/bin/$p" ] || { not_ok "test program $p not built ($BUILD_DIR/tests/kmod/bin/$p)"; preflight_ok=0; }
done
[ -x "$TRACE" ] || { not_ok "$TRACE missing (run make all)"; preflight_ok=0; }
[ "$nprog" -gt 0 ] || log "WARNING: no kernel target test programs (tests/kmod/*.c); running the byte-identity check only"

# A program whose source has the line "// vm: cpu-independent" tests nothing
# the CPU model changes (no update arithmetic, no FPU path): it runs in the
# matrix's -cpu max entries only, unless CKPT_VM_EVERY_CPU=1.
# CKPT_VM_PROGRAMS="a b": only these programs (a subset that fits a time box).
programs_for() { # CPU
	local p
	for p in $programs; do
		case " ${CKPT_VM_PROGRAMS:-$p} " in *" $p "*) ;; *) continue ;; esac
		if [ "$1" != max ] && [ "${CKPT_VM_EVERY_CPU:-0}" != 1 ] &&
			grep -q '^// vm: cpu-independent' "$ROOT/tests/kmod/$p.c" 2>/dev/null; then
			continue
		fi
		printf '%s ' "$p"
	done
}

kmod_run() { # KERNEL CPU DIR
	local k=$1 c=$2 d=$3 rc f name line progs
	[ "$nprog" -gt 0 ] || return 0
	progs=$(programs_for "$c")
	log "$kl/$c: kmod tests ($progs)"
	"$RUN" --kernel "$k" --cpu "$c" --quiet --out "$d/kmod" --log "$d/kmod.log" --image-size 64G --timeout "${CKPT_VM_TIMEOUT:-1500}" "${run_args[@]}" \
		"$VM_DIR/guest/kmod-tests.sh" $progs 2>"$d/kmod.runner"
	rc=$?
	sed 's/^/# /' "$d/kmod.runner"
	local counted=0
	for f in "$d"/kmod/tap/*.tap; do
		[ -f "$f" ] || continue
		name=$(basename "$f" .tap)
		while IFS= read -r line; do
			case $line in
			*"# SKIP"*)	# a skipped test did not pass
				counted=$((counted + 1))
				skip=$((skip + 1))
				not_ok "$kl/$c $name: ${line#ok } (skipped)" ;;
			"ok "*)
				counted=$((counted + 1))
				ok "$kl/$c $name: ${line#ok }" ;;
			"not ok "*)
				counted=$((counted + 1))
				not_ok "$kl/$c $name: ${line#not ok }" ;;
			esac
		done <"$f"
	done
	# A crash or a kernel report fails the run even if every test passed;
	# a run that failed without any "not ok" line is a failure of its own.
	if [ $rc -ne 0 ] && { [ $rc -ge 122 ] || [ $rc = 2 ] || ! grep -qs '^not ok' "$d"/kmod/tap/*.tap; }; then
		not_ok "$kl/$c kmod tests run: $(why $rc)$(runner_error "$d/kmod.runner") (log $d/kmod.log)"
	fi
	[ $counted -gt 0 ] || [ $rc -ne 0 ] || not_ok "$kl/$c kmod tests: no TAP results"
}

identity_run() { # KERNEL CPU DIR DTYPE STATE [WAYS:CHUNK]
	local k=$1 c=$2 d=$3 dtype=$4 state=$5 stripe=${6:-} rc hrc kimg uimg engine_image="on disk" what="byte identity"
	local images=() guest_args=() i ways
	kimg=$d/kernel.img uimg=$d/user.img
	mkdir -p "$d"
	[ "$state" != 8bit-bf16 ] || dtype=bf16	# bf16 masters need bf16 params
	if [ -n "$stripe" ]; then
		# The engine's own stripe set (ckptctl stripe) over WAYS drive files;
		# the guest's namespaces are copies of them, under dm-stripe
		what="byte identity over dm-stripe ($stripe) and the engine's stripe set"
		ways=${stripe%%:*} kimg=$d/user.stripe uimg=$d/user.stripe
		rm -f "$d"/user*.drive "$d/user.stripe"
		if ! "$BUILD_DIR/tools/ckptctl" stripe "$uimg" $(seq -f "$d/user%g.drive" 1 "$ways") \
			--stripe-kib $((${stripe#*:} / 2)) --drive-size $(((params * 40 / ways >> 20) + 4 << 20)) \
			>"$d/stripe.txt" 2>&1; then
			not_ok "$kl/$c $what: ckptctl stripe failed: $(tail -1 "$d/stripe.txt")"
			return
		fi
	fi
	log "$kl/$c: $what, $dtype, $state state, $params params, $presteps step(s) on the host then $steps steps in both, a rollback every $rollback_every${seed:+, seed $seed}"
	if ! "$TRACE" "$kimg" --format --force --dtype "$dtype" --state "$state" --params "$params" --steps 0 \
		${seed:+--seed "$seed"} >"$d/format.txt" 2>&1; then
		not_ok "$kl/$c $what: ckpt-trace --format on the host failed: $(tail -1 "$d/format.txt")"
		return
	fi
	if [ "$presteps" -gt 0 ] &&
		! "$TRACE" "$kimg" --steps "$presteps" ${seed:+--seed "$seed"} >"$d/presteps.txt" 2>&1; then
		not_ok "$kl/$c $what: the host's first $presteps step(s) failed: $(tail -1 "$d/presteps.txt")"
		return
	fi
	if [ -z "$stripe" ]; then
		# on tmpfs where the host has it: the engine maps such an image,
		# so the kernel is compared with the engine's mapped path (the
		# stripe sets below take its io_uring path)
		[ "$(stat -f -c %T /dev/shm 2>/dev/null)" != tmpfs ] ||
			uimg=$(mktemp -p /dev/shm ckpt-identity-XXXXXX.img)
		cp --sparse=always "$kimg" "$uimg"
		images=(--image "$kimg")
	else
		for i in $(seq 1 "$ways"); do
			cp --sparse=always "$d/user$i.drive" "$d/ns$i.img"
			images+=(--image "$d/ns$i.img")
		done
		guest_args=(--stripe "$stripe")
	fi
	# the userspace engine on the copy, while the guest runs
	( "$TRACE" "$uimg" --steps "$steps" --rollback-every "$rollback_every" ${seed:+--seed "$seed"} \
		>"$d/user.trace" 2>"$d/user.err"
	  echo $? >"$d/user.rc" ) &
	local hpid=$!
	"$RUN" --kernel "$k" --cpu "$c" --quiet "${images[@]}" --out "$d/identity" \
		--log "$d/identity.log" "${run_args[@]}" "$VM_DIR/guest/byte-identity.sh" "${guest_args[@]}" \
		"$steps" "$rollback_every" $seed 2>"$d/identity.runner"
	rc=$?
	sed 's/^/# /' "$d/identity.runner"
	wait $hpid
	if [ "$uimg" != "$d/user.img" ] && [ -z "$stripe" ]; then	# off tmpfs, beside the rest
		mv "$uimg" "$d/user.img"
		uimg=$d/user.img engine_image="mapped on tmpfs"
	fi
	hrc=$(cat "$d/user.rc" 2>/dev/null || echo 1)
	if [ "$hrc" != 0 ]; then
		not_ok "$kl/$c $what: the host's ckpt-trace failed (exit $hrc): $(tail -1 "$d/user.err")"
		fail=$((fail + 1)); failures+=("$kl/$c $what: trace not compared")
		return
	fi
	if [ $rc -ne 0 ]; then
		local reason
		reason=$(grep -as 'byte-identity: FAIL' "$d/identity.log" | tr -d '\r' | head -1)
		not_ok "$kl/$c $what: guest run failed: $(why $rc)${reason:+: ${reason#byte-identity: FAIL: }}$(runner_error "$d/identity.runner") (log $d/identity.log)"
		fail=$((fail + 1)); failures+=("$kl/$c $what: trace not compared")
		return
	fi
	if [ -n "$stripe" ]; then
		for i in $(seq 1 "$ways"); do
			if cmp "$d/ns$i.img" "$d/user$i.drive" >"$d/cmp.txt" 2>&1; then
				ok "$kl/$c $what: drive $i identical ($(stat -c %s "$d/ns$i.img") bytes)"
			else
				not_ok "$kl/$c $what: drive $i differs: $(head -1 "$d/cmp.txt")"
			fi
		done
	elif cmp "$kimg" "$uimg" >"$d/cmp.txt" 2>&1; then
		ok "$kl/$c $what: backing images identical ($(stat -c %s "$kimg") bytes; the engine's image ${engine_image})"
	else
		not_ok "$kl/$c $what: backing images differ: $(head -1 "$d/cmp.txt") ($kimg vs $uimg)"
	fi
	if diff "$d/user.trace" "$d/identity/trace.txt" >"$d/trace.diff" 2>&1; then
		ok "$kl/$c $what: trace output identical ($(wc -l <"$d/user.trace") lines)"
	else
		not_ok "$kl/$c $what: trace output differs ($d/trace.diff: $(grep -c '^[<>]' "$d/trace.diff") lines)"
	fi
}

# The byte identity over several drives: the engine's stripe set over 3 drive
# files (an odd count: every drive's share differs) with 64 KiB stripes,
# formatted on the host; the guest's namespaces are copies of the drives, with
# dm-ckpt over a dm-stripe of them. Both run the trace; every drive must end
# identical. Once per suite, smaller than an entry's own run (one TCG boot).
stripe_run() { # KERNEL CPU DIR
	local saved="$params $steps $rollback_every $presteps"
	params=${CKPT_VM_STRIPE_PARAMS:-300000} steps=60 rollback_every=20 presteps=0
	identity_run "$1" "$2" "$3/stripe" bf16 8bit 3:128
	read -r params steps rollback_every presteps <<<"$saved"
}

# count_tap WHAT RC BASE: the TAP lines of a guest script's console output
# BASE.out as tests, and a failed run (BASE.runner, BASE.log) without any
# "not ok" line, or a run without TAP, as one more failure.
count_tap() {
	local what=$1 rc=$2 base=$3 line counted=0
	sed 's/^/# /' "$base.runner"
	while IFS= read -r line; do
		case $line in
		"ok "*) counted=$((counted + 1)); ok "$what: ${line#ok }" ;;
		"not ok "*) counted=$((counted + 1)); not_ok "$what: ${line#not ok }" ;;
		esac
	done < <(tr -d '\r' <"$base.out")
	if [ $rc -ne 0 ] && { [ $rc -ge 122 ] || [ $rc = 2 ] || ! grep -qs '^not ok' <(tr -d '\r' <"$base.out"); }; then
		not_ok "$what run: $(why $rc)$(runner_error "$base.runner") (log $base.log)"
	fi
	[ $counted -gt 0 ] || [ $rc -ne 0 ] || not_ok "$what: no TAP results"
}

# Guest scripts (tests/vm/*.sh: the tools against the kernel target), TAP on
# the console; run once per kernel, with -cpu max.
# A script with the line "# vm: once" tests what the kernel version does not
# change (the Python client on the target, proved identical to the engine
# by the identity runs of every entry): it runs in the matrix's last -cpu
# max entry only, unless CKPT_VM_EVERY_CPU=1. --only NAME runs the script
# NAME alone.
scripts_run() { # KERNEL CPU DIR
	local k=$1 c=$2 d=$3 rc script name
	for script in "$ROOT"/tests/vm/*.sh; do
		[ -f "$script" ] || continue
		name=$(basename "$script" .sh)
		case $only in "" | scripts | "$name") ;; *) continue ;; esac
		if [ "$combo" != "$last_max_combo" ] && [ "${CKPT_VM_EVERY_CPU:-0}" != 1 ] &&
			grep -q '^# vm: once' "$script"; then
			continue
		fi
		log "$kl/$c: $name"
		"$RUN" --kernel "$k" --cpu "$c" --log "$d/$name.log" "${run_args[@]}" "$script" \
			>"$d/$name.out" 2>"$d/$name.runner"
		rc=$?
		count_tap "$kl/$c $name" $rc "$d/$name"
	done
}

# Assembly at boot (guest/assembly.sh): two images as namespaces 1 and 2;
# the first boot formats them and writes a ckpttab by uuid, the second boots
# with the namespaces swapped (the kernel scans namespaces asynchronously:
# their names may or may not follow) and
# assembles each target from that ckpttab. Once per suite: two boots of
# ~70 s each under TCG on a loaded 2-core host.
assembly_run() { # KERNEL CPU DIR
	local k=$1 c=$2 d=$3/assembly rc phase imgs
	mkdir -p "$d"
	truncate -s 64M "$d/a.img" "$d/b.img"
	for phase in format swapped; do
		log "$kl/$c: assembly at boot, $phase"
		if [ $phase = format ]; then
			imgs=(--image "$d/a.img" --image "$d/b.img")
		else
			[ -f "$d/out/ckpttab" ] && [ -f "$d/out/images" ] || {
				not_ok "$kl/$c assembly: the first boot left no ckpttab"; return; }
			imgs=(--image "$d/b.img" --image "$d/a.img" --add "$d/out/ckpttab:/etc/ckpttab"
				--add "$d/out/images")
		fi
		"$RUN" --kernel "$k" --cpu "$c" --log "$d/$phase.log" "${imgs[@]}" --out "$d/out" "${run_args[@]}" \
			"$VM_DIR/guest/assembly.sh" $phase >"$d/$phase.out" 2>"$d/$phase.runner"
		rc=$?
		count_tap "$kl/$c assembly $phase" $rc "$d/$phase"
	done
}

# NVMe-oF (scripts/vm/guest/nvmeof-*.sh, tests/vm/nvmeof.py): two guests on
# one qemu socket network (10.0.2.0/24, nothing beyond the host's loopback).
# The host formats the image and trains the reference with the userspace
# engine; the storage guest holds the image (NVMe namespace 1) and a plain
# device for the baseline (namespace 2), creates the kernel target and serves
# both; the trainer guest, with no image, connects with nvme-tcp and trains
# through the namespace with OffloadAdamW, bit-identical to the reference,
# and counts its interface's bytes against the baseline. Once per suite, on
# the last -cpu max entry with a Debian kernel: 2-4 min under TCG, most of
# it the trainer's `import torch` over 9p.
nvmeof_run() { # KERNEL CPU DIR
	local k=$1 c=$2 d=$3/nvmeof rc i port
	local nqn=nqn.2014-08.org.example.dm-ckpt:ckpt0 plain_nqn=nqn.2014-08.org.example.dm-ckpt:plain
	mkdir -p "$d"
	log "$kl/$c: NVMe-oF, a storage guest and a trainer guest"
	if ! PYTHONPATH=$BUILD_DIR/python /usr/bin/python3 "$ROOT/tests/vm/nvmeof.py" prep "$d/img" "$d/plain" "$d/ref" \
		>"$d/prep.out" 2>&1; then
		not_ok "$kl/$c nvmeof: the host's reference and image failed: $(tail -1 "$d/prep.out")"
		return
	fi
	# a free port of the host's loopback for the qemu socket network
	for ((port = 20000 + RANDOM % 20000; ; port++)); do
		grep -qi ":$(printf %04X $port) " /proc/net/tcp || break
	done
	"$RUN" --kernel "$k" --cpu "$c" --quiet --image "$d/img" --image "$d/plain" --net "listen:$port" \
		--ip 10.0.2.1/24 --log "$d/storage.log" --timeout 600 --add "$d/ref/keys:/ckpt/files/keys" \
		"${run_args[@]}" "$VM_DIR/guest/nvmeof-storage.sh" \
		10.0.2.1 "$nqn" "$plain_nqn" nqn.2014-08.org.example.dm-ckpt:trainer 5 /ckpt/files/keys \
		2>"$d/storage.runner" &
	local spid=$!
	# the trainer's qemu connects once the storage's listens
	for ((i = 0; i < 600; i++)); do
		grep -qi "0100007F:$(printf %04X $port) 00000000:0000 0A" /proc/net/tcp && break
		kill -0 $spid 2>/dev/null || break
		sleep 0.1
	done
	"$RUN" --kernel "$k" --cpu "$c" --quiet --no-ckpt --image-size 64M --net "connect:$port" --ip 10.0.2.2/24 \
		--log "$d/trainer.log" --timeout 600 "${run_args[@]}" "$VM_DIR/guest/nvmeof-trainer.sh" 10.0.2.1 "$d/ref" \
		2>"$d/trainer.runner"
	rc=$?
	tr -d '\r' <"$d/trainer.log" | grep -aE '^(ok|not ok|#) ' >"$d/trainer.out"
	count_tap "$kl/$c nvmeof trainer" $rc "$d/trainer"
	wait $spid
	rc=$?
	tr -d '\r' <"$d/storage.log" | grep -aE '^(ok|not ok|#) ' >"$d/storage.out"
	count_tap "$kl/$c nvmeof storage" $rc "$d/storage"
	grep -h '^# wire bytes' "$d/trainer.out" || true
}

# The runner's boot-crash retry (scripts/vm/run): a guest that panics before
# /init ran is booted again and reported, one that crashes after is not; and
# namespaces in the order of --image.
harness_run() { # KERNEL DIR
	local k=$1 d=$2 rc script=$2/harness-noop.sh kl
	kl=$(kernel_label "$k")
	mkdir -p "$d"
	printf '#!/bin/sh\necho harness\n' >"$script"
	CKPT_VM_BOOT_RETRIES=1 "$RUN" --kernel "$k" --no-ckpt --quiet --timeout 120 --log "$d/boot.log" \
		--append "init=/nonexistent rdinit=/nonexistent" "$script" 2>"$d/boot.runner"
	rc=$?
	if [ $rc = 123 ] && [ "$(grep -c 'RETRY 1/1' "$d/boot.runner")" = 1 ] && [ -f "$d/boot.log.boot-crash-1" ]; then
		ok "$kl harness: a guest that panics before /init is booted again once and reported"
	else
		not_ok "$kl harness: boot-crash retry (status $rc, runner output $d/boot.runner)"
	fi
	printf '#!/bin/sh\necho c >/proc/sysrq-trigger\n' >"$script"
	CKPT_VM_BOOT_RETRIES=1 "$RUN" --kernel "$k" --no-ckpt --quiet --timeout 120 --log "$d/late.log" \
		"$script" 2>"$d/late.runner"
	rc=$?
	if [ $rc = 123 ] && ! grep -q RETRY "$d/late.runner" && [ ! -e "$d/late.log.boot-crash-1" ]; then
		ok "$kl harness: a crash after /init started is never retried"
	else
		not_ok "$kl harness: a crash after /init was retried or not seen (status $rc, $d/late.runner)"
	fi
	# --image order: /dev/nvme0nN is the N-th image, whose first bytes say
	# "image N" (the kernel may name namespaces as their scans finish)
	local i imgs=()
	for i in 1 2 3 4; do
		rm -f "$d/ns$i.img"
		truncate -s $((63 + i))M "$d/ns$i.img"
		printf 'image %s' $i | dd of="$d/ns$i.img" conv=notrunc status=none
		imgs+=(--image "$d/ns$i.img")
	done
	printf '%s\n' '#!/bin/sh' \
		'for i in 1 2 3 4; do [ "$(dd if=/dev/nvme0n$i bs=7 count=1 2>/dev/null)" = "image $i" ] || exit 1; done' >"$script"
	"$RUN" --kernel "$k" --no-ckpt --quiet --timeout 120 --log "$d/order.log" "${imgs[@]}" "$script" 2>"$d/order.runner"
	rc=$?
	rm -f "$d"/ns?.img
	if [ $rc = 0 ]; then
		ok "$kl harness: four --image namespaces are /dev/nvme0n1..4 in the order given"
	else
		not_ok "$kl harness: --image order (status $rc, runner output $d/order.runner)"
	fi
}

want() { [ -z "$only" ] || [ "$only" = "$1" ]; }

if [ $preflight_ok = 1 ] && want harness; then
	harness_run "${matrix%%:*}" "$results/harness"
fi

if [ $preflight_ok = 1 ]; then
	# the last -cpu max entry; the NVMe-oF test's: the last one with a
	# Debian kernel (make kernel-debug's has no networking)
	last_max_combo="" nvmeof_combo=""
	for combo in $matrix; do
		case $combo in *:max | *:max:* | "${combo%%:*}")
			last_max_combo=$combo
			is_kernel_dir "${combo%%:*}" || nvmeof_combo=$combo ;;
		esac
	done
	for combo in $matrix; do
		# KERNEL[:CPU[:STATE]]: STATE (fp32, 8bit, 8bit-bf16) overrides --state for
		# this entry's byte identity run
		k=${combo%%:*} c=${combo#*:} entry_state=$state
		[ "$c" != "$combo" ] || c=max
		case $c in *:*) entry_state=${c#*:} c=${c%%:*} ;; esac
		kl=$(kernel_label "$k")
		if ! kver=$(resolve_kernel "$k"); then
			not_ok "$kl/$c: kernel $k is not installed (scripts/deps.sh)"
			continue
		fi
		d=$results/$kl-$c
		mkdir -p "$d"
		ts=$SECONDS
		if want kmod; then kmod_run "$k" "$c" "$d"; fi
		# bf16 and fp16 (a loss scale, overflow steps) alternate along the
		# matrix and start over swapped at each new kernel, so with the
		# default matrix each dtype meets both kernels and both variants.
		[ "$k" = "${last_k:-}" ] || { n_kernel=$((${n_kernel:-0} + 1)); n_combo=0; }
		last_k=$k
		n_combo=$((n_combo + 1))
		if want identity; then
			identity_run "$k" "$c" "$d" "$( (((n_combo + n_kernel) % 2)) && echo fp16 || echo bf16)" \
				"$entry_state"
		fi
		if { want scripts || [ -f "$ROOT/tests/vm/$only.sh" ]; } && [ "$c" = max ]; then scripts_run "$k" "$c" "$d"; fi
		if want nvmeof && [ "$combo" = "$nvmeof_combo" ]; then nvmeof_run "$k" "$c" "$d"; fi
		if want stripe && [ "$combo" = "$last_max_combo" ]; then stripe_run "$k" "$c" "$d"; fi
		if want assembly && [ "$c" = max ] && [ -z "${assembly_done:-}" ]; then
			assembly_run "$k" "$c" "$d"
			assembly_done=1
		fi
		log "$kl/$c ($kver): $((SECONDS - ts)) s"
	done
fi

matrix_label=$(for combo in $matrix; do printf '%s:%s ' "$(kernel_label "${combo%%:*}")" "${combo#*:}"; done)
matrix_label=${matrix_label% }
echo "# ---- VM suite: matrix '$matrix_label', $((SECONDS - t0)) s, results in $results"
retried=$(find "$results" -name '*.boot-crash-*' ! -path '*/harness/*' | wc -l)
echo "# guest boots retried after a crash before /init: $retried$([ "$retried" = 0 ] || echo " (logs: $(find "$results" -name '*.boot-crash-*' ! -path '*/harness/*' | tr '\n' ' '))")"
[ $skip -eq 0 ] || echo "# $skip tests were skipped (ok # SKIP), counted as failed"
for f in "${failures[@]}"; do echo "# FAILED: $f"; done
# the whole suite's result goes to docs/reliability.md (scripts/reliability.py)
if [ -z "$only" ]; then
	"$ROOT/scripts/reliability.py" record --build "$BUILD_DIR" --name "${CKPT_VM_RECORD_NAME:-kernel-vm-suite}" \
		--what "${CKPT_VM_RECORD_WHAT:-kernel target tests and kernel/engine byte identity in qemu} ($matrix_label)${CKPT_VM_PROGRAMS:+, kmod programs $CKPT_VM_PROGRAMS only}; $retried boot(s) retried" \
		--count $((pass + fail)) --unit tests --lost $fail --target "${CKPT_VM_RECORD_TARGET:-make check-vm}" ||
		echo "# could not record the result for docs/reliability.md"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
exit
}
