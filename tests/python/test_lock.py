# SPDX-License-Identifier: MIT
"""One writer per image: a second open of the same backing file through the
engine is refused, whoever tries it.

- another process (a second trainer): refused, told the holder's pid and name;
- the same process again: refused, told it is this process;
- a child forked from the trainer: its own open is refused (naming the
  parent), and the parent's device it inherited is refused too, with a clear
  error instead of a hang (the child has none of the engine's threads); the
  child does not keep the image locked once the parent has closed it.

Each time the first opener keeps working (it commits a step afterwards) and
the refused open changed nothing on disk (the file's bytes are the same).

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_lock
"""

import hashlib
import os
import subprocess
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ckpt  # noqa: E402
from ckpt_testlib import (digest, snapshot, tempdir, trace_format, trace_groups,  # noqa: E402
                          trace_step)

SEED = 77


def file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class LockTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempdir()
        self.dir = self._tmp.name
        self.path = os.path.join(self.dir, "lock.img")
        trace_format(self.path, SEED, "fp16").close()

    def tearDown(self):
        self._tmp.cleanup()

    def second_process(self, code, timeout=60):
        """Runs code in a new interpreter (same environment); returns (rc, out)."""
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), self.path],
                           capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
        return p.returncode, p.stdout + p.stderr

    def assert_first_keeps_working(self, dev):
        before = dev.committed_step
        self.assertEqual(trace_step(dev, SEED), before + 1)

    def test_second_process_is_refused(self):
        dev = ckpt.open(self.path)
        trace_step(dev, SEED)
        on_disk = file_digest(self.path)
        rc, out = self.second_process("""
            import ckpt, sys
            try:
                ckpt.open(sys.argv[1])
            except ckpt.CkptError as e:
                print(e.name, e.message)
                sys.exit(0)
            sys.exit("second open succeeded")
            """)
        self.assertEqual(rc, 0, out)
        self.assertIn("E_STATE", out)
        self.assertIn(f"is in use: process {os.getpid()} (", out)
        self.assertIn("one writer at a time", out)
        self.assertEqual(file_digest(self.path), on_disk, "the refused open changed the image")
        self.assert_first_keeps_working(dev)
        dev.close()
        # closed: the other process may open it now
        rc, out = self.second_process("import ckpt, sys; ckpt.open(sys.argv[1]).close()")
        self.assertEqual(rc, 0, out)

    def test_second_open_in_one_process_is_refused(self):
        dev = ckpt.open(self.path)
        on_disk = file_digest(self.path)
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.open(self.path)
        self.assertEqual(cm.exception.name, "E_STATE")
        self.assertIn("this process", cm.exception.message)
        self.assertIn(self.path, cm.exception.message)
        self.assertEqual(file_digest(self.path), on_disk)
        self.assert_first_keeps_working(dev)
        # the same file under another name (a hard link) is the same image
        link = os.path.join(self.dir, "link.img")
        os.link(self.path, link)
        with self.assertRaises(ckpt.CkptError) as cm:
            ckpt.open(link)
        self.assertIn("this process", cm.exception.message)
        dev.close()
        ckpt.open(link).close()

    def test_forked_child_is_refused_and_does_not_hang(self):
        dev = ckpt.open(self.path)
        trace_step(dev, SEED)
        before = digest(snapshot(dev))
        on_disk = file_digest(self.path)
        r, w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report each answer, never touch the parent's state
            os.close(r)
            os.close(go_w)
            out = os.fdopen(w, "w")
            try:
                try:
                    ckpt.open(self.path)
                    out.write("open: accepted\n")
                except ckpt.CkptError as e:
                    out.write(f"open: {e.name} {e.message}\n")
                for what, call in (("status", dev.status),
                                   ("begin", lambda: dev.begin(trace_groups(2, 3))),
                                   ("commit", dev.commit)):
                    try:
                        call()
                        out.write(f"{what}: accepted\n")
                    except ckpt.CkptError as e:
                        out.write(f"{what}: {e.name} {e.message}\n")
                out.write("done\n")
                out.close()
                # stay alive, holding whatever the fork gave us, while the
                # parent closes and reopens the image
                os.read(go_r, 1)
                dev.close()  # forgets the parent's device, joins nothing
            finally:
                os._exit(0)
        os.close(w)
        os.close(go_r)
        with os.fdopen(r) as f:
            lines = dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)
        self.assertTrue(lines["open"].startswith("E_STATE "), lines)
        self.assertIn(f"in use: process {os.getpid()} (", lines["open"])
        for what in ("status", "begin", "commit"):
            self.assertTrue(lines[what].startswith("E_STATE "), lines)
            self.assertIn(f"opened by process {os.getpid()}, which this process was forked from",
                          lines[what])
        self.assertEqual(file_digest(self.path), on_disk, "the child changed the image")
        self.assertEqual(digest(snapshot(dev)), before)
        self.assert_first_keeps_working(dev)
        # The parent closes: the child, still alive, does not hold the lock.
        dev.close()
        dev = ckpt.open(self.path)
        self.assert_first_keeps_working(dev)
        os.write(go_w, b"x")
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(status, 0)
        self.assert_first_keeps_working(dev)
        dev.close()

    def test_readers_work_while_a_trainer_holds_it(self):
        """What reads only (the uuid, info and verify of ckptctl) takes no lock."""
        dev = ckpt.open(self.path)
        self.assertEqual(ckpt.image_uuid(self.path), dev.uuid())
        self.assert_first_keeps_working(dev)
        dev.close()

    def test_export_never_replaces_an_image(self):
        """An export's destination that is a dm-ckpt image (a swapped argument) is
        refused unless forced, and one a trainer has open is refused even then:
        the trainer would go on committing into a file no longer there."""
        import ckpt.torch
        other = os.path.join(self.dir, "other.img")
        trace_format(other, SEED + 1, "fp16").close()
        on_disk = file_digest(other)
        dev = ckpt.open(self.path)
        trace_step(dev, SEED)
        for export in (dev.export, lambda out, **kw: ckpt.torch.export_safetensors(dev, out, **kw)):
            with self.assertRaises(ckpt.CkptError) as cm:
                export(other)
            self.assertEqual(cm.exception.name, "E_STATE")
            self.assertIn(f"{other} holds a dm-ckpt image", cm.exception.message)
            self.assertEqual(file_digest(other), on_disk)
        held = ckpt.open(other)     # a trainer has it open
        with self.assertRaises(ckpt.CkptError) as cm:
            dev.export(other, force=True)
        self.assertIn(f"{other} is in use: this process", cm.exception.message)
        self.assertEqual(file_digest(other), on_disk)
        self.assert_first_keeps_working(held)
        held.close()
        self.assertEqual(sorted(os.listdir(self.dir)), ["lock.img", "other.img"], "a temporary file is left")
        # forced, with no one holding it: replaced by the export
        self.assertEqual(dev.export(other, force=True), other)
        with open(other, "rb") as f:
            self.assertNotEqual(f.read(4), b"", "empty export")
        with self.assertRaises(ckpt.CkptError):
            ckpt.open(other)        # a safetensors file now
        dev.close()


def _create_and_train(path, steps, go, out):
    """One of two processes that create the same new OffloadAdamW path at once:
    waits for the other while it trains (one writer at a time), then trains
    `steps` steps; writes "resumed S", "ino I" (the file the optimizer opened)
    and "done S" to out."""
    import time

    import torch

    import ckpt.torch
    code = 0
    try:
        with open(out, "w") as f:
            torch.manual_seed(0)
            p = torch.nn.Parameter(torch.randn(1 << 20).to(torch.bfloat16))
            while time.time() < go:
                pass
            deadline = time.monotonic() + 120
            while True:
                try:
                    opt = ckpt.torch.OffloadAdamW([("w", p)], path, chunk_params=4096, hooks=False)
                    break
                except ckpt.CkptError as e:
                    if "is in use" not in e.message or time.monotonic() > deadline:
                        raise
                    time.sleep(0.005)
            f.write(f"resumed {opt.committed_step}\nino {os.stat(path).st_ino}\n")
            for _ in range(steps):
                p.grad = torch.ones_like(p)
                opt.step()
            f.write(f"done {opt.committed_step}\n")
            opt.close()
    except BaseException:  # noqa: BLE001 - the parent reads it from out
        import traceback
        with open(out, "a") as f:
            traceback.print_exc(file=f)
        code = 1
    os._exit(code)


class CreateRaceTest(unittest.TestCase):
    def test_rename_new_never_replaces(self):
        with tempdir() as d:
            a, b, c = (os.path.join(d, n) for n in ("a", "b", "c"))
            for path, text in ((a, "mine"), (b, "theirs")):
                with open(path, "w") as f:
                    f.write(text)
            self.assertFalse(ckpt.rename_new(a, b))
            with open(b) as f:
                self.assertEqual(f.read(), "theirs")
            self.assertTrue(os.path.exists(a), "the file to rename is kept")
            self.assertTrue(ckpt.rename_new(a, c))
            self.assertEqual(sorted(os.listdir(d)), ["b", "c"])
            with self.assertRaises(ckpt.CkptError) as cm:
                ckpt.rename_new(os.path.join(d, "nope"), os.path.join(d, "x"))
            self.assertEqual(cm.exception.name, "E_IO")

    def test_a_failed_open_never_removes_an_image_another_holds(self):
        """The creator's own open fails because the other process opened the
        new image first (in use): the image stays at its path, as the file the
        other process trains into (removing it left that one committing into
        a file at no path)."""
        import torch

        import ckpt.torch
        import ckpt.torch.optimizer as optimizer
        with tempdir() as d:
            path = os.path.join(d, "state.img")
            held = []
            real = optimizer._rename_new

            def rename_then_taken(src, dst):  # the other process opens it at once
                ok = real(src, dst)
                held.append(ckpt.open(dst))
                return ok
            optimizer._rename_new = rename_then_taken
            try:
                p = torch.nn.Parameter(torch.zeros(4096, dtype=torch.bfloat16))
                with self.assertRaises(ckpt.CkptError) as cm:
                    ckpt.torch.OffloadAdamW([("w", p)], path, chunk_params=4096, hooks=False)
                self.assertIn("is in use", cm.exception.message)
            finally:
                optimizer._rename_new = real
            uuid = held[0].uuid()
            held[0].close()
            self.assertTrue(os.path.exists(path), "the image the other process holds was removed")
            with ckpt.open(path) as dev:
                self.assertEqual(dev.uuid(), uuid)

    def test_two_processes_creating_one_path_share_one_image(self):
        """Two processes create the same new path at the same moment (a job
        launched twice): creation never replaces an image, the second resumes the
        first's, and the one image at the path holds every commit of both."""
        import multiprocessing
        import time
        ctx = multiprocessing.get_context("fork")
        steps = 3
        for trial in range(8):
            with self.subTest(trial=trial), tempdir() as d:
                path = os.path.join(d, "state.img")
                outs = [os.path.join(d, f"p{i}.out") for i in range(2)]
                go = time.time() + 0.5
                procs = [ctx.Process(target=_create_and_train, args=(path, steps, go, o)) for o in outs]
                for pr in procs:
                    pr.start()
                for pr in procs:
                    pr.join(180)
                text = []
                for o in outs:
                    with open(o) as f:
                        text.append(f.read())
                self.assertEqual([pr.exitcode for pr in procs], [0, 0], text)
                final = os.stat(path).st_ino
                for t in text:
                    self.assertIn(f"ino {final}\n", t, "a process trained on a file no longer at the path")
                resumed = sorted(int(t.split("resumed ")[1].split()[0]) for t in text)
                self.assertEqual(resumed, [0, steps], text)
                with ckpt.open(path) as dev:
                    self.assertEqual(dev.committed_step, 2 * steps, text)
                self.assertEqual(sorted(os.listdir(d)), ["p0.out", "p1.out", "state.img"],
                                 "a temporary file is left")


if __name__ == "__main__":
    unittest.main()
