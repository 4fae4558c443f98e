#!/bin/sh
# ckptctl's libnvme and libdevmapper commands against the real kernel target,
# inside the test VM (busybox, no udev):
#
#   scripts/vm/run [--kernel 6.1|6.12] tests/vm/ckptctl_dm.sh
#
# probe /dev/nvme0n1; create refused on a blank device; format; create /
# status / message / remove; the kernel target stepping a device the
# userspace engine started; verify, export and restore --rollback around it.
# TAP output; the exit status is 0 when all passed, else 1.
set -u
dev=/dev/nvme0n1
name=ckpt0
TAP_OUT=/tmp/ckptctl_dm.out
. /ckpt/lib/tap.sh

cd /tmp || exit 1
echo "# kernel $(uname -r); $(ckptctl --help >/dev/null 2>&1 && echo ckptctl found || echo ckptctl MISSING)"

# ---- probe (libnvme)
ok "probe $dev" has "NVMe namespace 1" ckptctl probe $dev
ok "probe names qemu's controller and serial" sh -c "ckptctl probe $dev | grep -q 'serial *ckpt0' && ckptctl probe $dev | grep -qi 'model *QEMU'"
ok "probe reports LBA format, atomic unit, write cache and a capacity" sh -c \
	"ckptctl probe $dev | grep -q 'LBA format' && ckptctl probe $dev | grep -q 'power-fail atomic' &&
	 ckptctl probe $dev | grep -q 'write cache' && ckptctl probe $dev | grep -q 'params in'"
ok "probe --json" has '"recommended"' ckptctl probe --json $dev
lba=$(cat /sys/block/nvme0n1/queue/logical_block_size)
ok "probe --json: the kernel's LBA size ($lba B), volatile write cache" sh -c \
	"ckptctl probe --json $dev | grep -q '\"lba_data_bytes\": $lba' && ckptctl probe --json $dev | grep -q '\"volatile_write_cache\": true'"
ckptctl probe $dev | sed 's/^/# /'

# ---- create on a blank device
dd if=/dev/zero of=$dev bs=4096 count=4 conv=fsync 2>/dev/null
fails_with "create on a blank device is refused" any "no valid dm-ckpt superblock" ckptctl create $name $dev
ok "... and left no device behind" sh -c "! dmsetup info $name >/dev/null 2>&1"
fails_with "status of a missing device" any "no device-mapper device named" ckptctl status $name
fails_with "remove of a missing device" any "no device-mapper device named" ckptctl remove $name

# ---- format, a few engine steps, create
cat >/tmp/m.json <<'JSON'
{"dtype": "bf16", "chunk_params": 4096,
 "tensors": [{"name": "emb", "shape": [300, 70]}, {"name": "ln", "shape": [70], "group": 1},
             {"name": "head", "shape": [70, 300]}]}
JSON
ok "format $dev from a manifest" ckptctl format $dev -m /tmp/m.json
fails_with "format again is refused without --force" any "holds a dm-ckpt image" ckptctl format $dev -m /tmp/m.json
ok "format --force formats it again" ckptctl format $dev -m /tmp/m.json --force
fails_with "ckpt-trace --format over the image is refused without --force" any "holds a dm-ckpt image" \
	ckpt-trace $dev --format --params 200000 --chunk-params 4096 --steps 2 --seed 3
ok "ckpt-trace: format and 2 steps on the backing device (userspace engine)" \
	ckpt-trace $dev --format --force --params 200000 --chunk-params 4096 --steps 2 --seed 3
ok "create $name --queue-depth 4 --staging-kb 2048" has "created /dev/mapper/$name" \
	ckptctl create $name $dev --queue-depth 4 --staging-kb 2048
ok "the node exists without udev" test -b /dev/mapper/$name
ok "the table carries the options" has "queue_depth 4 staging_kb 2048" dmsetup table $name
ok "status: idle at committed step 2" has "idle, committed step 2" ckptctl status $name
ok "status --json has the parsed fields" sh -c \
	"ckptctl status --json $name | grep -q '\"committed_step\": 2' && ckptctl status --json $name | grep -q '\"state\": \"idle\"'"
ckptctl status $name | sed 's/^/# /'
ok "status --prometheus: the committed step, labelled with name and backing device" sh -c \
	"ckptctl status $name --prometheus | grep -q '^dm_ckpt_committed_step{backing=\"$dev\",name=\"$name\".*} 2\$'"
ok "status --prometheus: state idle is 1, open 0; counters are _total" sh -c \
	"ckptctl status $name --prometheus >/tmp/p && grep -q '^dm_ckpt_state{.*state=\"idle\"} 1\$' /tmp/p &&
	 grep -q '^dm_ckpt_state{.*state=\"open\"} 0\$' /tmp/p && grep -q '^# TYPE dm_ckpt_steps_committed_total counter\$' /tmp/p"
ok "list --prometheus: every target's samples under one HELP and TYPE per family" sh -c \
	"ckptctl list --prometheus >/tmp/p && [ \$(grep -c '^# TYPE ' /tmp/p) -eq 16 ] &&
	 [ \$(grep -c '^dm_ckpt_committed_step{.*name=\"$name\"' /tmp/p) -eq 1 ]"
ok "message stats" has "committed_step 2" ckptctl message $name stats
fails_with "message abort without an open step is refused" any "failed" ckptctl message $name abort
fails_with "format refuses a device the target holds" any "in use" ckptctl format $dev -m /tmp/m.json
fails_with "import refuses a dm device" any "device-mapper device" ckptctl import /dev/mapper/$name --from /tmp/none
fails_with "restore --rollback refuses a held device" any "in use" ckptctl restore --rollback $dev
fails_with "verify --repair refuses a held device" any "in use" ckptctl verify --repair $dev
fails_with "verify --repair refuses a dm device" any "device-mapper device" ckptctl verify --repair /dev/mapper/$name
fails_with "create twice is refused" any "active already" ckptctl create $name $dev
fails_with "probe a dm device" any "not an NVMe namespace" ckptctl probe /dev/mapper/$name
# this guest has no NVMe-oF target (the runner's --nvmeof loads it;
# scripts/vm/guest/nvmeof-storage.sh serves for real)
fails_with "serve without configfs says so, and makes nothing" 1 "configfs is not mounted" \
	ckptctl serve $name --nqn nqn.2014-08.org.example:$name --addr 127.0.0.1 --any-host
fails_with "serve of a device that is not dm-ckpt" 1 "not a device-mapper device" \
	ckptctl serve $dev --nqn nqn.2014-08.org.example:$name --addr 127.0.0.1 --any-host

# ---- the kernel target steps the device
ok "ckpt-trace: 2 steps through the kernel target" has "committed step 4" ckpt-trace /dev/mapper/$name --steps 2 --seed 3
ok "status: committed step 4, 2 steps committed" sh -c \
	"ckptctl status $name | grep -q 'committed step 4' && ckptctl status --json $name | grep -q '\"steps_committed\": 2'"
ok "info through the dm device reads the backing device" has "committed step  4" ckptctl info /dev/mapper/$name
ok "verify through the dm device" has "verify: ok" ckptctl verify /dev/mapper/$name
ok "export through the dm device" ckptctl export /dev/mapper/$name --to /tmp/s4.safetensors --with-optimizer
ok "restore shows the previous step as readable" has "previous step   3 is readable" ckptctl restore /dev/mapper/$name

# ---- remove, roll back, create again
ok "remove $name" has "removed" ckptctl remove $name
ok "... the node is gone" sh -c "! test -e /dev/mapper/$name"
ok "restore --rollback on the backing device" has "rolled back from step 4 to step 3" ckptctl restore --rollback $dev
ok "verify after the rollback" has "verify: ok" ckptctl verify $dev
ok "create again" has "committed step 3" ckptctl create $name $dev
ok "status: committed step 3" has "committed step 3" ckptctl status $name
ok "ckpt-trace resumes at step 4 through the kernel" has "committed step 4" ckpt-trace /dev/mapper/$name --steps 1 --seed 3
ok "remove again" ckptctl remove $name

# ---- remove --force guard: a device that is not dm-ckpt
dmsetup create --noudevsync zero0 --table "0 8 error" && dmsetup mknodes zero0
fails_with "remove refuses a non-dm-ckpt device" any "not a dm-ckpt device" ckptctl remove zero0
fails_with "status refuses a non-dm-ckpt device" any "not a dm-ckpt device" ckptctl status zero0
ok "remove --force removes it" ckptctl remove --force zero0

# ---- a backing image on a device-mapper volume (as on LVM): the volume is
# the backing device, not the device under it
sectors=$(blockdev --getsz $dev)
dd if=/dev/zero of=$dev bs=4096 count=4 conv=fsync 2>/dev/null
dmsetup create --noudevsync lv0 --table "0 $((sectors - 8192)) linear $dev 8192" && dmsetup mknodes lv0
ok "format a dm-linear volume" ckptctl format /dev/mapper/lv0 -m /tmp/m.json
ok "info reads the volume itself" has "dm-ckpt format" ckptctl info /dev/mapper/lv0
fails_with "... not the device under it" any "superblock" ckptctl info $dev
ok "ckpt-trace steps the volume with the userspace engine" has "committed step 2" \
	ckpt-trace /dev/mapper/lv0 --steps 2 --seed 3
ok "create a target on the volume" has "committed step 2" ckptctl create $name /dev/mapper/lv0
ok "the target steps it" has "committed step 3" ckpt-trace /dev/mapper/$name --steps 1 --seed 3
ok "info through the target reads the volume" has "committed step  3" ckptctl info /dev/mapper/$name
ok "remove it" ckptctl remove $name
ok "verify the volume" has "verify: ok" ckptctl verify /dev/mapper/lv0
dmsetup remove --noudevsync lv0

echo "1..$n"
echo "$((n - failed)) passed, $failed failed"
exit $((failed > 0))	# 0 or 1: 2 and up are the runner's own failures
