#!/bin/sh
# Guest side of scripts/vm/bench.sh. /dev/nvme0n1 holds a dm-ckpt image
# (formatted on the host) at its start; fio uses the region from OFFSET on, so
# both measure the same emulated device in the same boot.
# Usage: bench.sh STEPS FIO_OFFSET FIO_SIZE FIO_RUNTIME
steps=$1 off=$2 size=$3 rt=$4
dev=/dev/nvme0n1
fail() { echo "bench: FAIL: $*"; exit 1; }
up() { cut -d' ' -f1 /proc/uptime; }

for rw in write read rw; do
	echo "bench: fio $rw"
	fio --name="seq-$rw" --filename=$dev --rw=$rw --rwmixread=50 --bs=1M --direct=1 \
		--ioengine=libaio --iodepth=8 --offset="$off" --size="$size" \
		--time_based --runtime="$rt" --output-format=json >/out/fio-$rw.json ||
		fail "fio $rw failed"
done

status=0
kfail() { echo "bench: FAIL: $*"; echo "$*" >/out/kernel.failed; status=1; }
if ! table=$(ckptctl info --table $dev); then
	kfail "ckptctl info --table $dev failed"
elif ! dmsetup create ckpt --noudevsync --table "$table"; then
	kfail "dmsetup create failed"
else
	dmsetup mknodes ckpt
	echo "bench: dm-ckpt: ckpt-trace /dev/mapper/ckpt --steps $steps"
	t0=$(up)
	if ckpt-trace /dev/mapper/ckpt --steps "$steps" >/out/kernel.trace 2>&1; then
		t1=$(up)
		echo "kernel $t0 $t1" >>/out/times
	else
		kfail "ckpt-trace on /dev/mapper/ckpt failed: $(tail -1 /out/kernel.trace)"
	fi
	dmsetup remove --noudevsync ckpt || kfail "dmsetup remove failed"
fi
ckptctl info --json $dev >/out/info.json || fail "ckptctl info --json failed"

# the userspace engine on the same device and image, for comparison
echo "bench: userspace engine: ckpt-trace $dev --steps $steps"
t0=$(up)
if ckpt-trace $dev --steps "$steps" >/out/user.trace 2>&1; then
	t1=$(up)
	echo "user $t0 $t1" >>/out/times
else
	echo "bench: userspace ckpt-trace failed: $(tail -1 /out/user.trace)"
	status=1
fi
exit $status
