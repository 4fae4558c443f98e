#!/bin/sh
# vm: hostfs nvmeof
# The trainer node of the NVMe-oF test (scripts/vm/tests.sh, nvmeof_run): no image of
# its own; it connects with nvme-tcp to the storage node at ADDR, trains
# through the served namespace with OffloadAdamW (tests/vm/nvmeof.py, the
# host's Python through hostrun) against the reference in REF, counts the
# bytes on eth0, and tells the storage node "done" on TCP port 4421.
#
#   nvmeof-trainer.sh ADDR REF
# TAP on the console; the exit status is 0 when all passed, else 1.
set -u
addr=${1:?usage: nvmeof-trainer.sh ADDR REF} ref=$2
TAP_OUT=/tmp/nvmeof-trainer.out
. /ckpt/lib/tap.sh
cd /tmp || exit 1
t_start=$(date +%s)
pyfile=${CKPT_HOST_REPO:-/nonexistent}/tests/vm/nvmeof.py

ok "the host's / is shared into the guest (hostrun)" command -v hostrun
ok "nvme-tcp is loaded" test -d /sys/module/nvme_tcp
ok "the storage node ($addr) answers" ping -c 1 -W 30 "$addr"

checks "nvmeof.py train" hostrun /usr/bin/python3 "$pyfile" train "$addr" "$ref" eth0
# a deleted controller leaves sysfs a moment later
i=0
while grep -qs tcp /sys/class/nvme/*/transport && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
ok "no NVMe-oF controller left" sh -c '! grep -qs tcp /sys/class/nvme/*/transport'
ok "told the storage node: done" sh -c "echo done | timeout 30 nc $addr 4421"
echo "# trainer: $(($(date +%s) - t_start)) s in the guest"
echo "1..$n"
echo "$((n - failed)) passed, $failed failed"
exit $((failed > 0))
