#!/bin/sh
# vm: hostfs nvmeof once
# A dm-ckpt device served over NVMe-oF (nvmet-tcp) and trained through with
# ckpt.torch.OffloadAdamW on the NVMe/TCP namespace, inside the test VM:
#
#   scripts/vm/run --kernel 6.12 --image A.img --image B.img tests/vm/nvmeof.sh
#   scripts/vm/tests.sh --matrix 6.12:max --only nvmeof
#
# "nvmeof" makes the runner load configfs, nvmet, nvmet-tcp and nvme-tcp;
# "hostfs" gives the host's Python and torch (hostrun); "once": tests.sh runs
# it on the first -cpu max entry of its matrix only. The storage side (the
# emulated NVMe, dm-ckpt, ckptctl serve) and the trainer side (nvme-tcp,
# OffloadAdamW on /dev/nvmeXnY) talk over the loopback interface, whose
# byte counters measure the wire. Without --image the runner's one blank
# namespace is cut in two with dm-linear: the dm-ckpt image and a plain
# device for the host-side offload baseline. The Python half is nvmeof.py
# next to this file (the host's copy). TAP output; exit 0 when all passed.
set -u
TAP_OUT=/tmp/nvmeof.out
. /ckpt/lib/tap.sh
t_start=$(date +%s)

finish() {
	echo "# nvmeof: $(($(date +%s) - t_start)) s in the guest"
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
	exit $((failed > 0))
}

echo "# kernel $(uname -r); host repo ${CKPT_HOST_REPO:-unknown}"
pyfile=${CKPT_HOST_REPO:-/nonexistent}/tests/vm/nvmeof.py
ok "the host's / is shared into the guest (hostrun)" command -v hostrun
ok "nvmeof.py is in the host's repository" test -f "/host$pyfile"
ok "configfs has the NVMe-oF target (nvmet loaded)" test -d /sys/kernel/config/nvmet
ok "nvmet-tcp and nvme-tcp are loaded" test -d /sys/module/nvmet_tcp -a -d /sys/module/nvme_tcp
ok "loopback up" ip link set lo up
[ $failed = 0 ] || finish

# the dm-ckpt image and the baseline's plain device: halves of nvme0n1
sectors=$(cat /sys/block/nvme0n1/size)
half=$((sectors / 2))
ok "dm-linear halves of nvme0n1 (${half} sectors each)" sh -c \
	"dmsetup create --noudevsync img --table '0 $half linear /dev/nvme0n1 0' &&
	 dmsetup create --noudevsync plain --table '0 $half linear /dev/nvme0n1 $half' && dmsetup mknodes"
[ $failed = 0 ] || finish

t=$(date +%s)
hostrun /usr/bin/python3 "$pyfile" /dev/mapper/img /dev/mapper/plain >"$TAP_OUT.py" 2>&1
rc=$?
while IFS= read -r line; do
	case $line in
	"PASS "*) n=$((n + 1)); echo "ok $n - ${line#PASS }" ;;
	"FAIL "*) n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - ${line#FAIL }" ;;
	"#"*) echo "$line" ;;
	*) echo "# $line" ;;
	esac
done <"$TAP_OUT.py"
n=$((n + 1))
if [ $rc = 0 ]; then
	echo "ok $n - nvmeof.py: exit 0 ($(($(date +%s) - t)) s)"
else
	echo "not ok $n - nvmeof.py: exit $rc ($(($(date +%s) - t)) s)"
	failed=$((failed + 1))
fi
ok "nothing left in nvmet's configfs" sh -c \
	'[ -z "$(find /sys/kernel/config/nvmet/subsystems /sys/kernel/config/nvmet/ports /sys/kernel/config/nvmet/hosts -mindepth 1 -maxdepth 1)" ]'
ok "no NVMe-oF controller left" sh -c '! ls /sys/class/nvme-fabrics/ctl/ 2>/dev/null | grep -q nvme'
finish
