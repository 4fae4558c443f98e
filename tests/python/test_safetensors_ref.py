# SPDX-License-Identifier: MIT
"""The project's safetensors writer and reader against the reference
implementation, the `safetensors` package (torch 2's venv only: Debian has no
package of it).

What the library writes (Device.export, ckpt.torch.export_safetensors,
ckptctl export --with-optimizer), the reference reads: the same names,
dtypes, shapes, values and metadata as the device holds. What the reference
writes (F32, F16, BF16 and integer tensors, metadata, a sharded checkpoint
with its index), the library reads (ckpt.safetensors, load_safetensors_into)
and lays out and loads a device from (ckptctl format --from-safetensors,
ckptctl import), bit for bit.

Run: PYTHONPATH=<build>/python <venv>/bin/python -m unittest -v test_safetensors_ref
"""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import ckpt  # noqa: E402
import ckpt.safetensors  # noqa: E402
from ckpt.torch import OffloadAdamW, export_safetensors, load_safetensors_into  # noqa: E402
from ckpt_testlib import CKPTCTL, tempdir  # noqa: E402

torch.set_num_threads(1)


def reference(path):
    """{name: torch tensor}, metadata, as the safetensors package reads them."""
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def bits(t):
    """A torch tensor's words as numpy (bf16 as uint16 bits, as ckpt.safetensors gives them)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 3)).to(torch.bfloat16)


def trained(d, steps=3):
    model = model_of()
    opt = OffloadAdamW(model.named_parameters(), os.path.join(d, "opt.img"), lr=1e-2, dtype="bf16")
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(8, 24, generator=g).to(torch.bfloat16)).float().pow(2).mean().backward()
        opt.step(blob=b"position 42")
        opt.zero_grad()
    return model, opt


def ckptctl(*args):
    out = subprocess.run([CKPTCTL, *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"ckptctl {' '.join(args)}: exit {out.returncode}\n{out.stdout}{out.stderr}")
    return out.stdout


class LibraryWritesReferenceReads(unittest.TestCase):
    def test_export_of_masters_and_lowp(self):
        with tempdir() as d:
            model, opt = trained(d)
            masters = opt.master_params()
            out = export_safetensors(opt.device, os.path.join(d, "m.safetensors"))
            tensors, meta = reference(out)
            self.assertEqual(sorted(tensors), sorted(masters))
            for n, t in tensors.items():
                self.assertEqual(t.dtype, torch.float32, n)
                self.assertTrue(torch.equal(t, masters[n].view(t.shape)), n)
            self.assertEqual((meta["step"], meta["dm-ckpt.step"], meta["ckpt.uuid"]), ("3", "3", opt.uuid))
            self.assertEqual(meta, ckpt.safetensors.load_file(out, with_metadata=True)[2])
            low = export_safetensors(opt.device, os.path.join(d, "lo.safetensors"), what="lowp")
            tensors, _ = reference(low)
            params = dict(model.named_parameters())
            for n, t in tensors.items():
                self.assertEqual(t.dtype, torch.bfloat16, n)
                self.assertTrue(torch.equal(t, params[n].detach()), n)
            opt.close()

    def test_export_with_optimizer_state(self):
        with tempdir() as d:
            _, opt = trained(d)
            state = {n: opt.read_state(n) for n in opt.names()}
            opt.close()
            out = os.path.join(d, "opt.safetensors")
            ckptctl("export", os.path.join(d, "opt.img"), "--to", out, "--with-optimizer")
            tensors, meta = reference(out)
            self.assertEqual(len(tensors), 3 * len(state))
            for n, (p, m, v) in state.items():
                for suffix, want in (("", p), (".exp_avg", m), (".exp_avg_sq", v)):
                    got = tensors[n + suffix]
                    self.assertEqual(got.dtype, torch.float32, n + suffix)
                    self.assertTrue(torch.equal(got.reshape(-1), want.reshape(-1)), n + suffix)
            self.assertEqual(meta["step"], "3")
            self.assertEqual(bytes.fromhex(meta["ckpt.trainer_blob"]), b"position 42")


class ReferenceWritesLibraryReads(unittest.TestCase):
    def tensors(self):
        g = torch.Generator().manual_seed(2)
        return {"a.weight": torch.randn(7, 5, generator=g),
                "a.bias": torch.randn(5, generator=g).to(torch.float16),
                "b.weight": torch.randn(3, 4, 2, generator=g).to(torch.bfloat16),
                "c.index": torch.arange(11, dtype=torch.int64),
                "d.scalar": torch.tensor(1.5)}

    def assert_read(self, arrays, dtypes, want):
        self.assertEqual(sorted(arrays), sorted(want))
        names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
        for n, t in want.items():
            self.assertEqual(dtypes[n], names[t.dtype], n)
            self.assertEqual(tuple(arrays[n].shape), tuple(t.shape), n)
            self.assertTrue(np.array_equal(np.asarray(arrays[n]), bits(t)), n)

    def test_file_and_metadata(self):
        with tempdir() as d:
            path, want = os.path.join(d, "w.safetensors"), self.tensors()
            save_file(want, path, metadata={"format": "pt", "note": "from the reference"})
            arrays, dtypes, meta = ckpt.safetensors.load_file(path, with_metadata=True)
            self.assert_read(arrays, dtypes, want)
            self.assertEqual(meta, {"format": "pt", "note": "from the reference"})

    def test_sharded_checkpoint(self):
        with tempdir() as d:
            want = self.tensors()
            names = sorted(want)
            weight_map = {}
            for k, part in enumerate((names[:2], names[2:])):
                f = f"model-{k + 1:05d}-of-00002.safetensors"
                save_file({n: want[n] for n in part}, os.path.join(d, f))
                weight_map.update({n: f for n in part})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
                json.dump({"metadata": {}, "weight_map": weight_map}, fh)
            for src in (d, os.path.join(d, "model.safetensors.index.json")):
                arrays, dtypes, _ = ckpt.safetensors.load_file(src, with_metadata=True)
                self.assert_read(arrays, dtypes, want)

    def test_a_device_laid_out_and_loaded_from_reference_weights(self):
        with tempdir() as d:
            model = model_of()
            weights = {n: p.detach().clone() for n, p in model.named_parameters()}
            path, img = os.path.join(d, "model.safetensors"), os.path.join(d, "dev.img")
            save_file(weights, path)
            ckptctl("format", img, "--from-safetensors", path, "--dtype", "bf16")
            ckptctl("import", img, "--from", path)
            with ckpt.open(img) as dev:
                for n, w in weights.items():
                    master, m, v = dev.read_state(n)
                    self.assertTrue(np.array_equal(master.reshape(w.shape), w.float().numpy()), n)
                    self.assertFalse(m.any() or v.any(), n)
            # and into a module, the reference's bf16 words exactly
            fresh = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                        torch.nn.Linear(40, 3)).to(torch.bfloat16)
            load_safetensors_into(fresh, path)
            for n, p in fresh.named_parameters():
                self.assertTrue(torch.equal(p.detach(), weights[n]), n)


if __name__ == "__main__":
    unittest.main()
