# SPDX-License-Identifier: MIT
"""The README's Python example runs as written."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ReadmeExample(unittest.TestCase):
    def test_example_runs(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        self.assertTrue(blocks, "README.md has no python example")
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([sys.executable, "-c", blocks[0]], cwd=d, capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("10 committed", out.stdout)
            self.assertIn("committed step 10 blob b'data position 320'", out.stdout)

    def test_quickstart_runs(self):
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py"),
                                  os.path.join(d, "state.img")], capture_output=True, text=True,
                                 timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("committed step 10", out.stdout)


if __name__ == "__main__":
    unittest.main()
