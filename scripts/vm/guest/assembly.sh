#!/bin/sh
# Guest side of the assembly-at-boot test (scripts/vm/tests.sh, assembly_run):
# two boots on the same two images, namespaces 1 and 2 of one NVMe controller.
#
#   assembly.sh format   images A, B as namespaces 1, 2: format both (different
#                        sizes and steps), write /etc/ckpttab by uuid, activate,
#                        check the targets' uuids and idempotence, deactivate;
#                        /out gets ckpttab and what each image is (images)
#   assembly.sh swapped  the same images as namespaces 2, 1 (the host swapped
#                        them) and that ckpttab in /etc: a ckpttab with a bad
#                        line changes nothing; activate --all maps each name to
#                        its own image (uuid, params, committed step, the
#                        backing device's numbers), steps it, deactivates
# TAP on the console; the exit status is 0 when all passed, else 1.
set -u
phase=${1:?usage: assembly.sh format|swapped}
TAP_OUT=/tmp/assembly.out
. /ckpt/lib/tap.sh
cd /tmp || exit 1

# the second namespace may be scanned a moment after the first
i=0
while [ ! -b /dev/nvme0n2 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
ok "two namespaces: nvme0n1, nvme0n2" test -b /dev/nvme0n2

uuid_of() { ckptctl info "$1" | sed -n '1s/.*, uuid //p'; }
params_of() { ckptctl info "$1" | sed -n 's/^  params *\([0-9]*\) in .*/\1/p'; }
# the node of namespace N (scripts/vm/init names them by nsid: the kernel
# scans them asynchronously, its names need not follow their numbers)
ns() { echo /dev/nvme0n$1; }
# its device numbers, MAJOR:MINOR
devno() { for b in /sys/block/nvme0n*; do [ "$(cat $b/nsid)" = "${1#/dev/nvme0n}" ] && cat $b/dev; done; }
no_targets() { [ -z "$(dmsetup ls --target ckpt 2>/dev/null | grep -v 'No devices found')" ]; }

if [ "$phase" = format ]; then
	dev_a=$(ns 1) dev_b=$(ns 2)
	ok "format A on namespace 1 ($dev_a), 2 steps" has "committed step 2" \
		ckpt-trace $dev_a --format --force --params 100000 --chunk-params 4096 --steps 2 --seed 1
	ok "format B on namespace 2 ($dev_b), 3 steps" has "committed step 3" \
		ckpt-trace $dev_b --format --force --params 150000 --chunk-params 4096 --steps 3 --seed 2
	ua=$(uuid_of $dev_a) ub=$(uuid_of $dev_b)
	ok "two images, two uuids ($ua, $ub)" sh -c "[ -n '$ua' ] && [ -n '$ub' ] && [ '$ua' != '$ub' ]"
	cat >/etc/ckpttab <<EOF
# dm-ckpt devices, by image uuid
ckpta  UUID=$ua  queue_depth=4

ckptb  UUID=$ub
EOF
	ok "activate --all" sh -c "ckptctl activate --all | grep -q 'ckpta: created' && ckptctl activate --all | grep -q 'ckptb: already active'"
	ok "the target's device-mapper uuid is CKPT-<image uuid>" has "CKPT-$ua" dmsetup info -c --noheadings -o uuid ckpta
	ok "status shows it" has "uuid *CKPT-$ub" ckptctl status ckptb
	ok "info shows it and the target" has "dm uuid *CKPT-$ua (kernel target ckpta)" ckptctl info $dev_a
	ok "the table carries ckpttab's options" has "queue_depth 4" dmsetup table ckpta
	ok "activate --all again: already active, nothing changed" sh -c \
		"ckptctl activate --all | grep -c 'already active' | grep -qx 2"
	fails_with "create of an active image under another name is refused by uuid" 1 "image $ua is active already as /dev/mapper/ckpta" \
		ckptctl create other $dev_a
	ok "... and left no device behind" sh -c "! dmsetup info other >/dev/null 2>&1"
	ok "deactivate --all" sh -c "ckptctl deactivate --all | grep -c removed | grep -qx 2"
	ok "... no target left" no_targets
	ok "deactivate --all again: not active, fine" has "not active" ckptctl deactivate --all
	cp /etc/ckpttab /out/ckpttab
	echo "$ua $ub $(params_of $dev_a) $(params_of $dev_b) $(ns 1) $(ns 2)" >/out/images
else
	read -r ua ub pa pb a1 b1 </ckpt/files/images
	dev_a=$(ns 2) dev_b=$(ns 1)
	echo "# first boot: A $a1, B $b1 (namespaces 1, 2); this boot: A $dev_a, B $dev_b (namespaces 2, 1)"
	ok "the namespaces are swapped: namespace 1 holds B, namespace 2 holds A" sh -c \
		"[ -n '$dev_a' ] && [ \"\$(ckptctl info $dev_b | sed -n '1s/.*, uuid //p')\" = '$ub' ] && [ \"\$(ckptctl info $dev_a | sed -n '1s/.*, uuid //p')\" = '$ua' ]"
	ok "/etc/ckpttab names the images by uuid only" sh -c "! grep -q /dev/ /etc/ckpttab"
	cp /etc/ckpttab bad.tab
	echo "ckptc /dev/nvme0n1 junk" >>bad.tab
	fails_with "a ckpttab with a bad line is refused with its line number" 1 "bad.tab:5: unknown option 'junk'" \
		ckptctl activate --all --ckpttab bad.tab
	ok "... and changes nothing" no_targets
	printf 'garbage\n' >bad2.tab
	fails_with "a garbage line: its line number" 1 "bad2.tab:1: 1 field; want NAME DEVICE" ckptctl activate --all --ckpttab bad2.tab
	ok "activate --all finds both by uuid" sh -c \
		"ckptctl activate --all >act.txt && grep -q 'ckpta: created /dev/mapper/ckpta on $dev_a' act.txt &&
		 grep -q 'ckptb: created /dev/mapper/ckptb on $dev_b' act.txt"
	sed 's/^/# /' act.txt
	ok "ckpta is image A: committed step 2" has "committed step 2" ckptctl status ckpta
	ok "ckptb is image B: committed step 3" has "committed step 3" ckptctl status ckptb
	ok "ckpta holds A's $pa params, ckptb B's $pb" sh -c \
		"[ '$pa' != '$pb' ] && [ '$(params_of /dev/mapper/ckpta)' = '$pa' ] && [ '$(params_of /dev/mapper/ckptb)' = '$pb' ]"
	ok "ckpta's table is on $dev_a's numbers ($(devno $dev_a))" has "ckpt $(devno $dev_a)" dmsetup table ckpta
	ok "A trains on from step 2 through its target" has "committed step 3" ckpt-trace /dev/mapper/ckpta --steps 1 --seed 1
	ok "activate --all again: already active" sh -c "ckptctl activate --all | grep -c 'already active' | grep -qx 2"
	ok "deactivate ckptb by name" has "ckptb: removed" ckptctl deactivate ckptb
	ok "deactivate --uuid of A" has "ckpta: removed" ckptctl deactivate --uuid "$ua"
	ok "... no target left" no_targets
	ok "activate --uuid B --readonly" has "ckptb: created .* (read-only)" ckptctl activate --uuid "$ub" --readonly
	ok "... a read-only table" has "READ-ONLY" dmsetup info ckptb
	ok "activate --device $dev_a (as udev does): A only" sh -c \
		"ckptctl activate --device $dev_a | grep -q 'ckpta: created' && ! dmsetup info ckptc >/dev/null 2>&1"
	ok "deactivate --all" sh -c "ckptctl deactivate --all | grep -c removed | grep -qx 2"
	ok "... no target left" no_targets
fi

echo "1..$n"
echo "$((n - failed)) passed, $failed failed"
exit $((failed > 0))
