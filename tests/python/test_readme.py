# SPDX-License-Identifier: MIT
"""The README's examples run as written: every ```python block, and every
```sh block with the project's tools on PATH. (```console blocks need root and
the kernel module; the VM tests run those commands.)"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(os.path.dirname(os.environ["PYTHONPATH"].split(os.pathsep)[0]), "tools")


def blocks(lang):
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```" + lang + r"\n(.*?)```", f.read(), re.S)


class ReadmeExamples(unittest.TestCase):
    def run_in_tmp(self, argv, **kw):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, PATH=TOOLS + os.pathsep + os.environ["PATH"])
            out = subprocess.run(argv, cwd=d, env=env, capture_output=True, text=True, timeout=300, **kw)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            return out.stdout

    def test_first_example(self):
        out = self.run_in_tmp([sys.executable, "-c", blocks("python")[0]])
        self.assertIn("10 committed", out)
        self.assertIn("committed step 10 blob b'data position 320'", out)

    def test_offload_example_resumes(self):
        out = self.run_in_tmp([sys.executable, "-c", blocks("python")[1]])
        self.assertIn("run 0: steps 1..20", out)
        self.assertIn("run 1: steps 21..40", out)

    def test_torch_state_moves(self):
        out = self.run_in_tmp([sys.executable, "-c", blocks("python")[2]])
        self.assertIn("moved at step 6 torch at 6", out)

    def test_sharded_example(self):
        out = self.run_in_tmp([sys.executable, "-c", blocks("python")[3]])
        for rank in (0, 1):
            self.assertIn(f"rank {rank} of 2: committed step 5, slice ", out)

    def test_ckptctl_examples(self):
        (script,) = blocks("sh")
        out = self.run_in_tmp(["sh", "-e", "-c", script])
        self.assertIn("verify: ok", out)
        self.assertIn("committed step", out)

    def test_quickstart_runs(self):
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py"),
                                  os.path.join(d, "state.img")], capture_output=True, text=True,
                                 timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("committed step 10", out.stdout)


if __name__ == "__main__":
    unittest.main()
