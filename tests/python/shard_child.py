# SPDX-License-Identifier: MIT
"""One rank of test_offload_shard (not a test module itself).

    shard_child.py DIR RANK WORLD PORT ITERS [KILL]

(test_offload_shard forks its ranks and calls main() with these arguments.)

Joins a gloo group on 127.0.0.1:PORT, opens a sharded OffloadAdamW on
DIR/state-{rank}.img (creating it, or resuming where the ranks agree) and trains
the iterations of shard_trace() that are not committed yet: fp32 gradients
made of small integers times a power of two (so their sum over the ranks is
exact in any order), a LossScaler, clip_grad_norm_, an Inf gradient on the
last rank at iteration INF_AT (every rank skips that step), no gradient for
"b" at iteration SKIP_AT. The trainer blob (the next iteration and the
scaler's state) is rank 0's; every other rank sets a blob of its own, which
must never be committed.

KILL "it:rank:when": at iteration it, rank SIGKILLs itself "before" or "after"
its commit. Environment: SHARD_FROM, the devices of an earlier run to resume
from on this world size (OffloadAdamW's reshard_from); SHARD_STATE and
SHARD_MASTER, the state formats of new devices. Prints "resumed S" (the step the ranks agreed on), "committed S"
after each commit and "done S" at the end, flushed.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ckpt.torch  # noqa: E402

INF_AT = 4
SKIP_AT = 3
MAX_NORM = 40.0


def shard_model():
    """The model every rank (and the one-device reference) starts from."""
    torch.manual_seed(7)
    w1 = torch.nn.Parameter(torch.randn(3000).to(torch.bfloat16))
    w2 = torch.nn.Parameter(torch.randn(50, 40).to(torch.bfloat16))
    b = torch.nn.Parameter(torch.randn(7).to(torch.bfloat16))
    return [("w1", w1), ("w2", w2), ("b", b)]


def shard_groups(named):
    return [{"params": named[:2]}, {"params": named[2:], "lr": 3e-3, "weight_decay": 0.0}]


def shard_grads(it, rank, world, scale):
    """{name: fp32 gradient} of rank at iteration it, already times the loss scale."""
    out = {}
    for k, (name, shape) in enumerate((("w1", (3000,)), ("w2", (50, 40)), ("b", (7,)))):
        if name == "b" and it == SKIP_AT:
            continue
        rng = np.random.default_rng([it, rank, k])
        g = rng.integers(-64, 65, size=shape).astype(np.float32) * np.float32(2.0 ** -12 * scale)
        if name == "w1" and it == INF_AT and rank == world - 1:
            g[0] = np.inf
        out[name] = torch.from_numpy(g)
    return out


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def die():
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def main(argv):
    d, rank, world, port, iters = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    kill = argv[5].split(":") if len(argv) > 5 else None
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    named = shard_model()
    opt = ckpt.torch.OffloadAdamW(shard_groups(named), os.path.join(d, "state-{rank}.img"), lr=1e-2,
                                  weight_decay=0.1, chunk_params=4096,
                                  state=os.environ.get("SHARD_STATE", "fp32"),
                                  master=os.environ.get("SHARD_MASTER", "fp32"),
                                  reshard_from=os.environ.get("SHARD_FROM"))
    scaler = ckpt.torch.LossScaler(init_scale=2.0 ** 4, growth_interval=2)
    it = 1
    if opt.blob():
        saved = json.loads(opt.blob())
        it = saved["it"]
        scaler.load_state_dict(saved["scaler"])
    say(f"resumed {opt.committed_step}")
    state = {"it": it}
    if rank == 0:
        opt.set_blob(lambda: json.dumps({"it": state["it"] + 1, "scaler": scaler.state_dict()}).encode())
    else:
        opt.set_blob(f"rank {rank}".encode())
    real_commit = opt.device.commit

    def commit(blob=b""):
        hit = kill and int(kill[0]) == state["it"] and int(kill[1]) == rank
        if hit and kill[2] == "before":
            die()
        r = real_commit(blob)
        if hit and kill[2] == "after":
            die()
        return r

    opt.device.commit = commit
    params = dict(named)
    while state["it"] <= iters:
        grads = shard_grads(state["it"], rank, world, scaler.get_scale())
        for n, p in params.items():
            p.grad = grads[n].to(torch.bfloat16) if n in grads else None
        scaler.unscale_(opt)
        opt.clip_grad_norm_(MAX_NORM)
        scaler.step(opt)
        scaler.update()
        if opt.last_result == "committed":
            say(f"committed {opt.committed_step}")
            say(f"norm {opt.committed_step} {opt.last_grad_norm!r}")
        state["it"] += 1
        opt.zero_grad(set_to_none=True)
        time.sleep(float(os.environ.get("SHARD_PACE", "0")))
    say(f"done {opt.committed_step}")
    opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
