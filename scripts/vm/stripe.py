#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""dm-stripe's mapping on the host: an image cut into the WAYS drives that a
`striped WAYS CHUNK` table over them presents as the image, and back.

    stripe.py split IMAGE CHUNK_BYTES DRIVE...   chunk k of IMAGE goes to drive
        k % WAYS at (k // WAYS) * CHUNK_BYTES; every drive gets as many chunks,
        the last ones zero past the image's end
    stripe.py join IMAGE SIZE CHUNK_BYTES DRIVE...   the first SIZE bytes of
        what the drives present, into IMAGE; fails if anything past SIZE is not
        zero (the striped device is longer than the image it holds)

The VM tests (scripts/vm/tests.sh, the striped byte identity) cut the host's
image into namespaces this way and put the guest's back together to compare.
"""
import os
import sys


def chunks_per_drive(size, chunk, ways):
    return -(-size // (chunk * ways))


def split(image, chunk, drives):
    ways, size = len(drives), os.path.getsize(image)
    per = chunks_per_drive(size, chunk, ways)
    outs = [open(d, "wb") for d in drives]
    with open(image, "rb") as f:
        for k in range(per * ways):
            data = f.read(chunk)
            outs[k % ways].write(data + bytes(chunk - len(data)))
    for o in outs:
        o.close()


def join(image, size, chunk, drives):
    ways = len(drives)
    ins = [open(d, "rb") for d in drives]
    per = min(os.path.getsize(d) for d in drives) // chunk
    with open(image, "wb") as out:
        done = 0
        for k in range(per * ways):
            data = ins[k % ways].read(chunk)
            keep = max(0, min(chunk, size - done))
            out.write(data[:keep])
            if any(data[keep:]):
                sys.exit(f"stripe.py: chunk {k} has data past the image's {size} bytes")
            done += keep
    if done != size:
        sys.exit(f"stripe.py: the drives hold {done} bytes, not {size}")


def main(argv):
    if len(argv) >= 4 and argv[0] == "split":
        split(argv[1], int(argv[2]), argv[3:])
    elif len(argv) >= 5 and argv[0] == "join":
        join(argv[1], int(argv[2]), int(argv[3]), argv[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
