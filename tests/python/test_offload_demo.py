# SPDX-License-Identifier: MIT
"""Smoke test of the main demo (demo/train.py, run by `make demo`) at a small size.

DEMO_SIZE=tiny (2 layers, d_model 64) and DEMO_STEPS=40: the same driver, the
same three trainings (one SIGKILLed halfway and restarted, one uninterrupted,
one with torch.optim.AdamW), the same checks, the plot and the safetensors
export. Asserts what the demo asserts: the resumed losses equal the
uninterrupted ones bit for bit, and the offloaded curve tracks torch's: mean
|loss difference| over the last 20% of the steps below TRACK_BOUND (0.5) x the
batch noise of the loss (its standard deviation around a moving average). Both
runs compute AdamW on the same bf16 gradients; they differ only by fp32
rounding, which shows in the losses from step 2 on (a master param 1 ulp away
from torch's rounds to another bf16 value now and then), so the curves may
wander apart by a fraction of the batch noise but not drift. Measured: 0.0034
vs noise 0.22 here; 0.008 vs noise 0.054 for the full demo (300-400 steps).

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_demo
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from ckpt_testlib import tempdir  # noqa: E402


class DemoSmoke(unittest.TestCase):
    def test_tiny_demo(self):
        with tempdir() as d:
            out = os.path.join(d, "demo")
            env = dict(os.environ, DEMO_SIZE="tiny", DEMO_STEPS="40", DEMO_OUT=out)
            p = subprocess.run([sys.executable, os.path.join(ROOT, "demo", "train.py")], env=env,
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
            self.assertIn("bit-identical at every step", p.stdout)
            self.assertIn("resumed from the device's committed step", p.stdout)
            for f in ("loss.png", "model.safetensors", "summary.json", "interrupted.img"):
                self.assertIn(os.path.join(out, f), p.stdout)
            with open(os.path.join(out, "loss.png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            with open(os.path.join(out, "summary.json")) as f:
                s = json.load(f)
            self.assertEqual(s["steps"], 40)
            self.assertTrue(s["resumed_identical_to_uninterrupted"])
            self.assertTrue(s["recomputed_steps_identical"])
            self.assertGreater(s["resumed_from_step"], 0)
            self.assertLess(s["resumed_from_step"], 40)
            a, b, c = (s["losses"][k] for k in ("interrupted", "uninterrupted", "torch"))
            self.assertEqual(a, b)
            self.assertEqual(b[0], c[0])  # the same first step: same init, batch, dropout
            self.assertLess(s["mean_abs_diff_vs_torch_last_20pct"], s["track_bound"] * s["loss_noise_last_20pct"])
            self.assertLess(s["loss_last_10pct_mean"], b[0] - 1.0)  # it learns
            # the exported checkpoint holds the model's params
            from ckpt import safetensors
            arrays = safetensors.load_file(os.path.join(out, "model.safetensors"))
            self.assertIn("blocks.0.qkv.weight", arrays)
            self.assertEqual(sum(a.size for a in arrays.values()), s["n_params"])


if __name__ == "__main__":
    unittest.main()
