# SPDX-License-Identifier: MIT
"""Child process of test_restore (not a test module itself).

    restore_child.py MODE PATH SEED DTYPE T [OUT]

Formats PATH, loads the trace's initial params and commits T steps of the
seeded trace (ckpt_testlib.trace_*), then, by MODE:

  commit        save a snapshot of the committed state to OUT (.npz), exit 0
  (the uncommitted step T+1 below uses junk gradients and hyperparameters)
  kill-partial  begin step T+1, write the first half of the gradients, SIGKILL itself
  kill-all      begin step T+1, write all gradients, print "ready", wait to be killed
  kill-aborted  begin step T+1, write all gradients, abort, SIGKILL itself
  kill-overflow step T+1 with an Inf gradient (commit -> overflow), begin T+1
                again, write part of it, SIGKILL itself
  loop          print "ready", then commit steps T+1, T+2, ... printing
                "committed <t>" after each, until killed

Progress lines go to stdout, flushed, so the parent knows what was committed.
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from ckpt_testlib import (TRACE_TENSORS, save_snapshot, snapshot, trace_begin, trace_format,  # noqa: E402
                          trace_step)


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def die():
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached
    sys.exit(3)


def main():
    mode, path, seed, dtype, t = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    dev = trace_format(path, seed, dtype)
    for _ in range(t):
        say(f"committed {trace_step(dev, seed)}")
    names = [n for n, _, _ in TRACE_TENSORS]
    if mode == "commit":
        save_snapshot(snapshot(dev), sys.argv[6])
        dev.close()
        say("done")
        return
    if mode == "loop":
        say("ready")
        while True:
            say(f"committed {trace_step(dev, seed)}")
    # Steps that are never committed use other gradients and hyperparameters
    # than the trace, so that anything they left behind would show.
    g = trace_begin(dev, seed, t + 1, junk=True)
    if mode == "kill-partial":
        for n in names[: len(names) // 2]:
            dev.write_grad(n, g[n])
        say("partial")
        die()
    if mode == "kill-all":
        for n in names:
            dev.write_grad(n, g[n])
        say("ready")
        time.sleep(120)
        sys.exit(4)  # the parent should have killed us
    if mode == "kill-aborted":
        for n in names:
            dev.write_grad(n, g[n])
        dev.abort()
        say("aborted")
        die()
    if mode == "kill-overflow":
        bad = {n: np.array(g[n]) for n in names}
        bad["w1"].reshape(-1)[7] = 0x7C00 if dtype == "fp16" else 0x7F80  # +Inf
        for n in names:
            dev.write_grad(n, bad[n])
        result = dev.commit(b"never stored")
        say(f"result {result}")
        g = trace_begin(dev, seed, t + 1, junk=True)
        for n in names[1:]:
            dev.write_grad(n, g[n])
        die()
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
