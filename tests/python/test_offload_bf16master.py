# SPDX-License-Identifier: MIT
"""bf16 masters with stochastic rounding and 8-bit moments
(ckpt.format(..., state="8bit", master="bf16"), OffloadAdamW(state="8bit",
master="bf16")) against fp32 state on the demo's GPT (demo/train.py, size
tiny).

Two trainings on the same batches, seeds, lr schedule and clipping (the
8-bit test's `train`), one with fp32 state (12 B per param) and one with
8-bit moments and bf16 masters (4 B per param), for STEPS steps. Asserted
band: the mean |loss difference| over the last 20% of the steps stays below
BAND x the batch noise of the loss there, both curves learn, the first
step's loss agrees to 0.01 (the bf16 masters are the init rounded
stochastically, the fp32 run's model gets them rounded to nearest), and the
image is at most 0.45x the fp32 one (two slots of p_lo and records: 12.2
against 28.1 B per param; 8-bit moments alone give 16.2, 0.58x).
Measured: 0.0072 against a noise of 0.067 (0.11 x noise; final losses 2.8773
fp32, 2.8824 bf16+8bit), images 5.55 and 2.43 MB, about 17 s on the 2-core
build machine.
Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_offload_bf16master
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ckpt_testlib import tempdir  # noqa: E402
from test_offload_8bit import demo, train  # noqa: E402

STEPS = 60
BAND = 0.5


class Bf16Masters(unittest.TestCase):
    def test_loss_curve_tracks_fp32_state(self):
        import numpy as np
        import ckpt

        dm = demo()
        with tempdir() as d:
            a = train(dm, os.path.join(d, "fp32.img"), "fp32", STEPS)
            b = train(dm, os.path.join(d, "bf16.img"), "8bit", STEPS, master="bf16")
            with ckpt.open(os.path.join(d, "bf16.img")) as dev:
                self.assertEqual(dev.committed_step, STEPS)
            sizes = [os.path.getsize(os.path.join(d, f)) for f in ("fp32.img", "bf16.img")]
        tail = slice(int(0.8 * STEPS), STEPS)
        diff = float(np.mean(np.abs(a[tail] - b[tail])))
        k = max(5, STEPS // 20)
        noise = float(np.nanstd((a - dm.smooth(a, k))[tail]))
        print(f"\nbf16 masters + 8-bit moments vs fp32 state, tiny demo GPT, {STEPS} steps: mean |loss "
              f"diff| last 20% {diff:.4f}, batch noise {noise:.4f} (band {BAND} x noise); final loss "
              f"{a[tail].mean():.4f} fp32, {b[tail].mean():.4f} bf16+8bit; image bytes {sizes[0]} fp32, "
              f"{sizes[1]} bf16+8bit", file=sys.stderr)
        self.assertLess(abs(a[0] - b[0]), 0.01)
        self.assertLess(diff, BAND * noise)
        for c in (a, b):
            self.assertLess(c[tail].mean(), c[0] - 1.0)  # it learns
        self.assertLess(sizes[1], 0.45 * sizes[0])


if __name__ == "__main__":
    unittest.main()
