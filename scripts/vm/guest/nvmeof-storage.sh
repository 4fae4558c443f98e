#!/bin/sh
# vm: nvmeof
# The storage node of the NVMe-oF test (scripts/vm/tests.sh, nvmeof_run):
# namespace 1 holds a dm-ckpt image formatted on the host, namespace 2 is a
# plain device for the baseline. It creates the kernel target, serves it with
# ckptctl serve on ADDR to the trainer's HOST_NQN (and the plain device, to
# any host, through nvmet's configfs, on the same port), waits for the
# trainer's "done" on TCP port 4421, then checks the steps it committed,
# unserves, and checks that nothing of serve is left.
#
#   nvmeof-storage.sh ADDR NQN PLAIN_NQN HOST_NQN STEPS
# TAP on the console; the exit status is 0 when all passed, else 1.
set -u
addr=${1:?usage: nvmeof-storage.sh ADDR NQN PLAIN_NQN HOST_NQN STEPS} nqn=$2 plain_nqn=$3 host_nqn=$4 steps=$5
TAP_OUT=/tmp/nvmeof-storage.out
. /ckpt/lib/tap.sh
cd /tmp || exit 1
nvmet=/sys/kernel/config/nvmet
t_start=$(date +%s)

finish() {
	echo "# storage: $(($(date +%s) - t_start)) s in the guest"
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
	exit $((failed > 0))
}

i=0
while [ ! -b /dev/nvme0n2 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
# the node of namespace N (scripts/vm/init names them by nsid)
ns() { echo /dev/nvme0n$1; }
# its device numbers, MAJOR:MINOR
devno() { for b in /sys/block/nvme0n*; do [ "$(cat $b/nsid)" = "${1#/dev/nvme0n}" ] && cat $b/dev; done; }
img=$(ns 1) plain=$(ns 2)
ok "two namespaces: the image ($img) and the baseline's ($plain)" test -b "$img" -a -b "$plain"
ok "eth0 is $addr" sh -c "ip -4 addr show eth0 | grep -q 'inet $addr/'"
[ $failed = 0 ] || finish
find $nvmet | sort >/tmp/nvmet.before

ok "ckptctl create ckpt0 $img" has "committed step 0" ckptctl create ckpt0 "$img"
# the backing device already in a namespace of another subsystem, under
# another of its names: serve must see it is the same device
alias=/tmp/backing-alias other=$nvmet/subsystems/${nqn}.other
ok "$img put in another subsystem as $alias" sh -c "mknod $alias b $(devno $img | tr : ' ') &&
	mkdir $other && mkdir $other/namespaces/1 && echo $alias >$other/namespaces/1/device_path"
fails_with "serve refuses a device whose backing is in another subsystem under another name" 1 \
	"served already, by subsystem ${nqn}.other" ckptctl serve ckpt0 --nqn "$nqn" --addr "$addr"
ok "that subsystem removed" sh -c "rmdir $other/namespaces/1 $other && rm $alias"
ok "ckptctl serve ckpt0 on $addr to $host_nqn" has "served as $nqn" \
	ckptctl serve ckpt0 --nqn "$nqn" --addr "$addr" --host "$host_nqn"
fails_with "a second serve of the device is refused" 1 "served already" \
	ckptctl serve /dev/mapper/ckpt0 --nqn "${nqn}x" --addr "$addr"
fails_with "serve refuses a device that is not dm-ckpt" 1 "not a device-mapper device" \
	ckptctl serve "$plain" --nqn "$plain_nqn" --addr "$addr"
fails_with "serve refuses a bad NQN" 1 "not an NQN" ckptctl serve ckpt0 --nqn "nqn.a/b" --addr "$addr"
fails_with "serve refuses a bad address" 1 "not an IPv4 or IPv6 address" \
	ckptctl serve ckpt0 --nqn "${nqn}x" --addr "10.0.2.300"
fails_with "unserve of what serve did not make is refused" 1 "not served by ckptctl serve" \
	ckptctl unserve "${nqn}x"
port=$(sed -n 's/.*"port": "\([0-9]*\)".*/\1/p' "/run/ckpt/nvmet/$nqn.json")
ok "serve recorded its port ($port)" test -n "$port"

# the baseline's plain device, served as nvmetcli would, on the same port
serve_plain() {
	s=$nvmet/subsystems/$plain_nqn
	mkdir $s && echo 1 >$s/attr_allow_any_host && mkdir $s/namespaces/1 &&
		echo "$plain" >$s/namespaces/1/device_path && echo 1 >$s/namespaces/1/enable &&
		ln -s $s $nvmet/ports/$port/subsystems/$plain_nqn
}
unserve_plain() {
	s=$nvmet/subsystems/$plain_nqn
	rm $nvmet/ports/$port/subsystems/$plain_nqn && echo 0 >$s/namespaces/1/enable &&
		rmdir $s/namespaces/1 && rmdir $s
}
ok "the plain device served as $plain_nqn" serve_plain
echo "# serving; waiting for the trainer"

# the trainer says "done" when it is through (or has given up)
done_msg=$(timeout 400 nc -l -p 4421 </dev/null)
ok "the trainer said done ($done_msg)" test "$done_msg" = done
ok "the kernel target committed the trainer's $steps steps" sh -c \
	"ckptctl status ckpt0 | grep -q 'committed step $steps' && ckptctl status --json ckpt0 | grep -q '\"steps_committed\": $steps'"
ckptctl status ckpt0 | sed 's/^/# /'
ok "the plain device unserved" unserve_plain
ok "ckptctl unserve ckpt0" has "no longer served" ckptctl unserve ckpt0
ok "nvmet's configfs is as before serve" sh -c "find $nvmet | sort | cmp /tmp/nvmet.before -"
ok "no record of serve left" sh -c "[ -z \"\$(ls /run/ckpt/nvmet)\" ]"
ok "ckptctl remove ckpt0" has "removed" ckptctl remove ckpt0
ok "verify $img: committed step $steps" sh -c "ckptctl verify $img | tee /dev/stderr | grep -q 'verify: ok'"
finish
