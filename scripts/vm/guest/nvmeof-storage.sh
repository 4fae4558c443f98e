#!/bin/sh
# vm: nvmeof
# The storage node of the NVMe-oF test (scripts/vm/tests.sh, nvmeof_run):
# namespace 1 holds a dm-ckpt image formatted on the host, namespace 2 is a
# plain device for the baseline. It creates the kernel target, serves it with
# ckptctl serve on ADDR to the trainer's HOST_NQN, authenticated both ways
# with the DH-HMAC-CHAP secrets of KEYS (and the plain device, to any host,
# through nvmet's configfs, on the same port), waits for the trainer's "done"
# on TCP port 4421, then checks the steps it committed, unserves, and checks
# that nothing of serve is left. Before, a serve whose secrets ckptctl makes
# (nvme-cli) and its unserve.
#
#   nvmeof-storage.sh ADDR NQN PLAIN_NQN HOST_NQN STEPS KEYS
# TAP on the console; the exit status is 0 when all passed, else 1.
set -u
addr=${1:?usage: nvmeof-storage.sh ADDR NQN PLAIN_NQN HOST_NQN STEPS KEYS} nqn=$2 plain_nqn=$3 host_nqn=$4
steps=$5 keys=$6
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

# the device numbers, MAJOR:MINOR, of namespace N
devno() { for b in /sys/block/nvme0n*; do [ "$(cat $b/nsid)" = "$1" ] && cat $b/dev; done; }
# the kernel's name of namespace N
kname() { for b in /sys/block/nvme0n*; do [ "$(cat $b/nsid)" = "$1" ] && echo ${b##*/}; done; }
# ckptctl finds a device by its numbers, never by the name the kernel gives
# it: /dev/KNAME of each namespace is made the other one's node here (as it
# is where the kernel names namespaces in the order their scans finish and
# the nodes are made by nsid), the image and the plain device have nodes of
# their own
i=0
while [ -z "$(devno 2)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
img=/dev/ckpt-ns1 plain=/dev/ckpt-ns2
ok "two namespaces: the image ($img) and the baseline's ($plain), /dev/$(kname 1) and /dev/$(kname 2) swapped" \
	sh -c "mknod $img b $(devno 1 | tr : ' ') && mknod $plain b $(devno 2 | tr : ' ') &&
	rm /dev/$(kname 1) /dev/$(kname 2) && mknod /dev/$(kname 1) b $(devno 2 | tr : ' ') &&
	mknod /dev/$(kname 2) b $(devno 1 | tr : ' ')"
ok "eth0 is $addr" sh -c "ip -4 addr show eth0 | grep -q 'inet $addr/'"
[ $failed = 0 ] || finish
find $nvmet | sort >/tmp/nvmet.before

ok "ckptctl create ckpt0 $img" has "committed step 0" ckptctl create ckpt0 "$img"
# the backing device already in a namespace of another subsystem, under
# another of its names: serve must see it is the same device
alias=/tmp/backing-alias other=$nvmet/subsystems/${nqn}.other
ok "$img put in another subsystem as $alias" sh -c "mknod $alias b $(devno 1 | tr : ' ') &&
	mkdir $other && mkdir $other/namespaces/1 && echo $alias >$other/namespaces/1/device_path"
fails_with "serve refuses a device whose backing is in another subsystem under another name" 1 \
	"served already, by subsystem ${nqn}.other" ckptctl serve ckpt0 --nqn "$nqn" --addr "$addr" --any-host
ok "that subsystem removed" sh -c "rmdir $other/namespaces/1 $other && rm $alias"
# secrets made by ckptctl (nvme gen-dhchap-key), kept in its record, 0600
gen=nqn.2014-08.org.example.dm-ckpt:gen
ok "ckptctl serve to $gen, secrets made: its nvme connect line" has "nvme connect -t tcp -a $addr -s 4420 -n ${nqn}-gen --hostnqn=$gen --dhchap-secret=DHHC-1:00:" \
	ckptctl serve ckpt0 --nqn "${nqn}-gen" --addr "$addr" --host "$gen"
ok "... nvmet has them for the host, ffdhe2048 and hmac(sha256)" sh -c \
	"grep -q '^DHHC-1:00:' $nvmet/hosts/$gen/dhchap_key && grep -q '^DHHC-1:00:' $nvmet/hosts/$gen/dhchap_ctrl_key &&
	 grep -q ffdhe2048 $nvmet/hosts/$gen/dhchap_dhgroup && grep -q 'hmac(sha256)' $nvmet/hosts/$gen/dhchap_hash"
ok "... the record holding them is root's alone" sh -c "[ \"\$(stat -c %a /run/ckpt/nvmet/${nqn}-gen.json)\" = 600 ]"
ok "... and unserve removes the host with them" sh -c "ckptctl unserve ${nqn}-gen && [ ! -e $nvmet/hosts/$gen ]"
ok "ckptctl serve ckpt0 on $addr to $host_nqn, its secrets from $keys" has "served as $nqn" \
	ckptctl serve ckpt0 --nqn "$nqn" --addr "$addr" --host "$host_nqn" --key-file "$keys"
ok "... the subsystem takes that host only" sh -c \
	"[ \"\$(cat $nvmet/subsystems/$nqn/attr_allow_any_host)\" = 0 ] && [ \"\$(ls $nvmet/subsystems/$nqn/allowed_hosts)\" = $host_nqn ]"
ok "it serves one namespace, the dm-ckpt device (its backing device $img is not served)" sh -c \
	"[ \"\$(ls $nvmet/subsystems/$nqn/namespaces)\" = 1 ] &&
	 [ \"\$(cat $nvmet/subsystems/$nqn/namespaces/1/device_path)\" = /dev/mapper/ckpt0 ]"
fails_with "a second serve of the device is refused" 1 "served already" \
	ckptctl serve /dev/mapper/ckpt0 --nqn "${nqn}x" --addr "$addr" --any-host
fails_with "serve refuses a device that is not dm-ckpt" 1 "not a device-mapper device" \
	ckptctl serve "$plain" --nqn "$plain_nqn" --addr "$addr" --any-host
fails_with "serve refuses a bad NQN" 1 "not an NQN" ckptctl serve ckpt0 --nqn "nqn.a/b" --addr "$addr" --any-host
fails_with "serve refuses a bad address" 1 "not an IPv4 or IPv6 address" \
	ckptctl serve ckpt0 --nqn "${nqn}x" --addr "10.0.2.300" --any-host
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
