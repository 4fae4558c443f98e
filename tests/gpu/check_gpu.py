# SPDX-License-Identifier: MIT
"""make check-gpu: OffloadAdamW training a CUDA model.

Where torch sees no CUDA device it says so and exits 77, the suites' one
skip code (tests/README.md): nothing was checked, which is not a pass.
Where one is:

1. equality: a small Llama (transformers, random init) in bf16 on the GPU,
   OffloadAdamW with its hooks (gradients copied on a side stream into pinned
   buffers during backward) against hooks=False, bit for bit, and against
   torch.optim.AdamW on fp32 masters on the GPU given the same bf16 gradients,
   within the AdamW tolerance of tests/python/test_offload_adamw.py;
2. GPU memory (torch.cuda.max_memory_allocated over a training step, the
   model's weights, gradients and optimizer state) of the same model under
   torch's AdamW (bf16 params, fp32 masters and moments on the GPU, the usual
   mixed precision), OffloadAdamW, and DeepSpeed's ZeRO-Offload (ZeRO stage 2,
   offload_optimizer to the CPU, DeepSpeed's CPU Adam), each in its own
   process; the ratios are printed and written to docs/performance.md
   ("GPU memory"), with the GPU's name and the versions.

    tests/gpu/check_gpu.py --build build [--hidden 1024 --layers 8] [--no-record]

It runs under torch 2's venv (scripts/venv.sh), in a few minutes.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

# The suites' one skip code (tests/README.md; ctest's SKIP_RETURN_CODE).
SKIP = 77

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DOC = os.path.join(ROOT, "docs", "performance.md")
BEGIN = "<!-- gpu memory: written by make check-gpu -->"
END = "<!-- end of gpu memory -->"


def llama(hidden, layers, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 64), max_position_embeddings=256)
    return LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)


def batches(n, device, batch=4, seq=128):
    import torch
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randint(0, 4096, (batch, seq), generator=g)
        yield x.to(device)


# ---------------------------------------------------------------- 1. equality

def equality(args):
    import torch
    from ckpt.torch import OffloadAdamW
    steps, lr = 5, 1e-3
    out = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        for hooks in (True, False):
            model = llama(256, 2, "cuda")
            opt = OffloadAdamW(model.named_parameters(), os.path.join(d, f"h{int(hooks)}.img"), lr=lr,
                               dtype="bf16", hooks=hooks)
            grads = []
            for x in batches(steps, "cuda"):
                model(input_ids=x, labels=x).loss.backward()
                grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
                opt.step()
                opt.zero_grad()
                if hooks and not opt.last_step_hooked:
                    raise SystemExit("check-gpu: a step on CUDA did not keep its writes from backward")
            out[hooks] = ({n: t.clone() for n, t in opt.master_params().items()},
                          {n: p.detach().clone() for n, p in model.named_parameters()})
            opt.close()
        for a, b in zip(out[True], out[False]):
            for n in a:
                if not torch.equal(a[n].cpu(), b[n].cpu()):
                    raise SystemExit(f"check-gpu: hooks=True and hooks=False differ at {n}")
        # torch's AdamW on fp32 masters on the GPU, fed the same bf16 gradients
        model = llama(256, 2, "cuda")
        masters = {n: p.detach().float().clone().requires_grad_() for n, p in model.named_parameters()}
        ref = torch.optim.AdamW(masters.values(), lr=lr)
        for g in grads:
            for n, m in masters.items():
                m.grad = g[n].float()
            ref.step()
        worst = 0.0
        for n, m in masters.items():
            r = m.detach().cpu()
            p = out[True][0][n].reshape(r.shape).cpu()
            tol = 5e-6 * r.abs() + 1e-6 * r.abs().max()
            worst = max(worst, float(((p - r).abs() / tol.clamp_min(1e-30)).max()))
            if not bool(((p - r).abs() <= tol).all()):
                raise SystemExit(f"check-gpu: {n}: OffloadAdamW and torch's AdamW differ by "
                                 f"{float((p - r).abs().max())}")
    print(f"check-gpu: equality: {steps} steps of a Llama on {torch.cuda.get_device_name()}: hooks on a "
          f"side stream = hooks=False bit for bit; torch AdamW within tolerance (worst {worst:.2f} of it)")


# ---------------------------------------------------------------- 2. memory

def memory_child(kind, hidden, layers, tmp):
    """One training step's peak GPU memory under one optimizer, as JSON on stdout."""
    import torch
    model = llama(hidden, layers, "cuda")
    n_params = sum(p.numel() for p in model.parameters())
    data = list(batches(3, "cuda"))
    if kind == "torch":
        # the usual mixed precision: fp32 masters beside the bf16 model
        masters = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
        opt = torch.optim.AdamW(masters, lr=1e-4)

        def step():
            for m, p in zip(masters, model.parameters()):
                m.grad = p.grad.float()
            opt.step()
            with torch.no_grad():
                for m, p in zip(masters, model.parameters()):
                    p.copy_(m)
            model.zero_grad(set_to_none=True)
            for m in masters:
                m.grad = None
        run = model
    elif kind == "offload":
        from ckpt.torch import OffloadAdamW
        opt = OffloadAdamW(model.named_parameters(), os.path.join(tmp, "mem.img"), lr=1e-4, dtype="bf16")

        def step():
            opt.step()
            opt.zero_grad(set_to_none=True)
        run = model
    else:
        import deepspeed
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("CKPT_GPU_PORT", "29531"))
        deepspeed.init_distributed()
        cfg = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "steps_per_print": 10 ** 9}
        run, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)

        def step():
            run.step()
    for i, x in enumerate(data):
        if i == 1:      # the first step allocated what every step keeps
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        loss = run(input_ids=x, labels=x).loss
        (run.backward(loss) if kind == "deepspeed" else loss.backward())
        step()
    torch.cuda.synchronize()
    print(json.dumps({"kind": kind, "peak": torch.cuda.max_memory_allocated(), "params": n_params}))


def memory(args):
    import torch
    res = {}
    for kind in ("torch", "offload", "deepspeed"):
        p = subprocess.run([sys.executable, __file__, "--child", kind, "--hidden", str(args.hidden),
                            "--layers", str(args.layers), "--tmp", args.tmp],
                           capture_output=True, text=True, timeout=420)
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode or not lines:
            raise SystemExit(f"check-gpu: the {kind} memory run failed:\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
        res[kind] = json.loads(lines[-1])
    n = res["torch"]["params"]
    gib = 1 << 30
    rows = [(k, res[k]["peak"]) for k in ("torch", "offload", "deepspeed")]
    for k, peak in rows:
        print(f"check-gpu: memory: {k:9s} {peak / gib:7.2f} GiB ({peak / n:.1f} B a param)")
    less_torch = 1 - res["offload"]["peak"] / res["torch"]["peak"]
    less_ds = 1 - res["offload"]["peak"] / res["deepspeed"]["peak"]
    print(f"check-gpu: memory: OffloadAdamW uses {100 * less_torch:.0f}% less than torch's AdamW, "
          f"{100 * less_ds:.0f}% less than DeepSpeed's ZeRO-Offload (the seed claimed 65% less)")
    if not args.no_record:
        record(res, less_torch, less_ds, args)


def record(res, less_torch, less_ds, args):
    import torch
    import deepspeed
    n = res["torch"]["params"]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    lines = [BEGIN, "",
             f"Measured by `make check-gpu` on {when}: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"deepspeed {deepspeed.__version__}; a Llama of {n / 1e6:.0f}M params (hidden {args.hidden}, "
             f"{args.layers} layers) in bf16, batch 4 x 128 tokens; `torch.cuda.max_memory_allocated()` over "
             f"a training step after the first.", "",
             "| optimizer | peak GPU memory | per param |", "|---|---|---|"]
    names = {"torch": "torch AdamW (fp32 masters and moments on the GPU)",
             "offload": "OffloadAdamW (state on the device)",
             "deepspeed": "DeepSpeed ZeRO-Offload (stage 2, CPU Adam)"}
    for k in ("torch", "offload", "deepspeed"):
        lines.append(f"| {names[k]} | {res[k]['peak'] / (1 << 30):.2f} GiB | {res[k]['peak'] / n:.1f} B |")
    lines += ["", f"OffloadAdamW: {100 * less_torch:.0f}% less than torch's AdamW, {100 * less_ds:.0f}% less "
              f"than ZeRO-Offload.", "", END]
    text = open(DOC).read()
    block = "\n".join(lines)
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n## GPU memory\n\n" + block + "\n"
    with open(DOC, "w") as f:
        f.write(text)
    print(f"check-gpu: recorded in {os.path.relpath(DOC, ROOT)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return memory_child(args.child, args.hidden, args.layers, args.tmp)
    import torch
    if not torch.cuda.is_available():
        print(f"check-gpu: SKIPPED: no CUDA device here (torch {torch.__version__}, built for "
              f"CUDA {torch.version.cuda}): nothing checked, nothing recorded", file=sys.stderr)
        return SKIP
    equality(args)
    memory(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
