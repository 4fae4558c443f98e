# SPDX-License-Identifier: MIT
"""The C ABI's handle contract seen from Python: threads and names.

ctypes releases the GIL during every call into libckpt, so calls from several
threads run in the library at the same time. One device's calls are
serialized; close() waits for the calls in flight, and every call after it
fails with a clear CkptError (never a crash: a SIGSEGV here kills the whole
test process, which ctest reports as a failure). Tensor names and paths are
refused, by name, when they cannot cross into C unchanged (a NUL would cut
"w\\x00x" to "w").

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m unittest -v test_capi
"""

import ctypes
import io
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import ckpt  # noqa: E402
from ckpt_testlib import snapshot, tempdir  # noqa: E402

CHUNK = 4096
# big enough that read_state spends its time inside the library
TENSORS = [("w", (256, 1024)), ("b", (1000,))]
GROUPS = [{"lr": 1e-3}]


class DeviceCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempdir()
        self.path = os.path.join(self._tmp.name, "img")
        layout = ckpt.Layout()
        for n, s in TENSORS:
            layout.add(n, s)
        ckpt.format(self.path, layout, dtype="bf16", chunk_params=CHUNK)
        with ckpt.open(self.path) as dev:
            dev.load_params({n: np.full(s, 0.5, np.float32) for n, s in TENSORS})

    def tearDown(self):
        self._tmp.cleanup()


class TestThreads(DeviceCase):
    def hammer(self, dev, calls, stop, errors, after_close):
        """Loops over calls until stop; records what each call raised."""
        def run():
            while not stop.is_set():
                for fn in calls:
                    closed_before = dev._h is None
                    try:
                        fn()
                    except ckpt.CkptError as e:
                        if closed_before or (e.name == "E_STATE" and "closed" in e.message):
                            after_close.append(e)  # after close, or racing with it
                        elif e.name != "E_TWICE":  # b written twice in the step
                            errors.append(e)
                    except Exception as e:  # noqa: BLE001 - anything else is a bug
                        errors.append(e)
                    else:
                        if closed_before:
                            errors.append(f"{fn} succeeded after close")
        return run

    def test_close_while_calls_in_flight(self):
        grad = np.zeros(1000, np.uint16)
        for _ in range(10):
            dev = ckpt.open(self.path)
            dev.begin(GROUPS)
            stop = threading.Event()
            errors, after_close = [], []
            calls = [lambda: dev.read_state("w"), lambda: dev.read_params("w"),
                     lambda: dev.write_grad("b", grad), dev.info, dev.blob]
            threads = [threading.Thread(target=self.hammer(dev, calls, stop, errors, after_close))
                       for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(0.05)
            dev.close()
            time.sleep(0.02)  # the threads keep calling the closed device
            stop.set()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertTrue(after_close, "no call was made after close")
            for e in after_close:
                self.assertEqual(e.name, "E_STATE", e)
                self.assertIn("closed", e.message)
        # nothing was lost: the image opens with the committed state
        with ckpt.open(self.path) as dev:
            self.assertEqual(dev.committed_step, 0)
            self.assertTrue(np.all(dev.read_state("w")[0] == 0.5))

    def test_two_threads_drive_steps(self):
        """Steps and reads from two threads: each call is whole, the device
        stays consistent (every "committed" is one step, a reopen agrees)."""
        dev = ckpt.open(self.path)
        grads = {n: np.zeros(s, np.uint16) for n, s in TENSORS}
        committed, errors = [], []

        def stepper():
            # a begin meets the other thread's open step (E_STATE); a step
            # begun is written and committed by its thread, whole
            for _ in range(30):
                try:
                    dev.begin(GROUPS)
                except ckpt.CkptError as e:
                    if e.name != "E_STATE":
                        errors.append(e)
                    time.sleep(0.001)
                    continue
                try:
                    for n, g in grads.items():
                        dev.write_grad(n, g)
                    committed.append(dev.commit(b"x" * 100))
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

        def reader():
            for _ in range(100):
                try:
                    dev.info()
                    dev.read_state("b")
                    dev.blob()
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

        threads = [threading.Thread(target=f) for f in (stepper, stepper, reader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertTrue(committed)
        self.assertEqual(set(committed), {"committed"})
        self.assertEqual(dev.committed_step, len(committed))
        snap = snapshot(dev)
        dev.close()
        with ckpt.open(self.path) as dev2:
            self.assertEqual(snapshot(dev2), snap)

    def test_calls_after_close(self):
        dev = ckpt.open(self.path)
        h = dev._h
        dev.close()
        dev.close()  # twice is fine
        for fn, args in ((dev.info, ()), (dev.begin, (GROUPS,)), (dev.commit, ()), (dev.abort, ()),
                         (dev.read_params, ("w",)), (dev.read_state, ("b",)), (dev.blob, ()),
                         (dev.write_grad, ("b", np.zeros(1000, np.uint16))),
                         (dev.load_params, ("b", np.zeros(1000, np.float32)))):
            with self.assertRaises(ckpt.CkptError, msg=fn.__name__) as cm:
                fn(*args)
            self.assertEqual(cm.exception.name, "E_STATE")
            self.assertIn("closed", cm.exception.message)
        # the library itself refuses the stale handle (a thread that took it
        # before close), even after another device is opened
        with ckpt.open(self.path) as other:
            i = ckpt._abi._Info()
            r = ckpt._abi._lib.ckpt_info(h, ctypes.byref(i))
            self.assertEqual(-r, ckpt.ERRORS.index("E_STATE"))
            self.assertIn(b"closed", ckpt._abi._lib.ckpt_last_error())
            self.assertEqual(other.committed_step, 0)
            r = ckpt._abi._lib.ckpt_info(ctypes.c_void_p(12345), ctypes.byref(i))
            self.assertEqual(-r, ckpt.ERRORS.index("E_INVAL"))
            self.assertIn(b"not a device", ckpt._abi._lib.ckpt_last_error())


class TestNames(DeviceCase):
    """A name crosses into C as a NUL-terminated string: "w\\x00x" must not
    become "w"."""

    def assertBadName(self, fn, *args):
        with self.assertRaises(ckpt.CkptError) as cm:
            fn(*args)
        self.assertEqual(cm.exception.name, "E_INVAL")
        self.assertIn("NUL", cm.exception.message)

    def test_nul_in_tensor_names(self):
        with ckpt.open(self.path) as dev:
            dev.begin(GROUPS)
            before = snapshot(dev)
            self.assertBadName(dev.write_grad, "b\x00x", np.zeros(1000, np.uint16))
            self.assertBadName(dev.read_params, "b\x00x")
            self.assertBadName(dev.read_state, "w\x00")
            self.assertEqual(snapshot(dev), before)
            # b was not written: writing it now is its first time
            dev.write_grad("b", np.zeros(1000, np.uint16))
            dev.abort()
        with tempdir() as d:
            layout = ckpt.Layout()
            self.assertBadName(layout.add, "w\x00x", (3,))
            self.assertEqual(layout.tensors, [])
            p = os.path.join(d, "img")
            ckpt.format(p, layout.add("w", (3,)), chunk_params=2048)
            with ckpt.open(p) as dev:
                before = snapshot(dev)
                self.assertBadName(dev.load_params, "w\x00x", np.zeros(3, np.float32))
                self.assertBadName(dev.load_params, {"w\x00": np.zeros(3, np.float32)})
                self.assertEqual(snapshot(dev), before)

    def test_junk_names(self):
        with ckpt.open(self.path) as dev:
            dev.begin(GROUPS)
            for junk in (b"w", None, 3, ["w"]):
                for fn, args in ((dev.write_grad, (junk, np.zeros(3, np.uint16))),
                                 (dev.read_params, (junk,)), (dev.read_state, (junk,)),
                                 (dev.load_params, (junk, np.zeros(3, np.float32))),
                                 (ckpt.Layout().add, (junk, (3,)))):
                    with self.assertRaises(TypeError, msg=f"{fn.__name__}({junk!r})") as cm:
                        fn(*args)
                    self.assertIn("name must be a str", str(cm.exception))
            with self.assertRaises(ckpt.CkptError) as cm:  # not encodable as UTF-8
                dev.read_params("w\udcff")
            self.assertEqual(cm.exception.name, "E_INVAL")
            self.assertIn("UTF-8", cm.exception.message)
            dev.abort()

    def test_nul_in_paths(self):
        self.assertBadName(ckpt.open, self.path + "\x00junk")
        self.assertBadName(ckpt.open, os.fsencode(self.path) + b"\x00junk")
        stub = os.path.join(self._tmp.name, "new")
        self.assertBadName(ckpt.format, stub + "\x00junk", ckpt.Layout().add("w", (3,)))
        self.assertFalse(os.path.exists(stub))


class TestProgress(DeviceCase):
    """ckpt.format and Device.export show a tqdm bar fed by libckpt's
    progress hook: with progress=True on any stderr, never when it is not
    a terminal by default."""

    def run_captured(self, f):
        err, sys.stderr = sys.stderr, io.StringIO()
        try:
            f()
            return sys.stderr.getvalue()
        finally:
            sys.stderr = err

    def test_version(self):
        self.assertRegex(ckpt.__version__, r"^[0-9]+\.[0-9]+\.[0-9]+$")

    def test_format_and_export(self):
        layout = ckpt.Layout()
        for n, s in TENSORS:
            layout.add(n, s)
        img = os.path.join(self._tmp.name, "p.img")
        out = self.run_captured(lambda: ckpt.format(img, layout, chunk_params=CHUNK, progress=True))
        self.assertIn("format: ", out)
        self.assertIn("65/65", out)  # every chunk: 64 of w, 1 of b
        with ckpt.open(self.path) as dev:
            st = os.path.join(self._tmp.name, "p.safetensors")
            out = self.run_captured(lambda: dev.export(st, progress=True))
            self.assertIn(f"{256 * 1024 + 1000}/{256 * 1024 + 1000}", out)
            self.assertEqual(self.run_captured(lambda: dev.export(st)), "")  # not a terminal
        self.assertEqual(self.run_captured(lambda: ckpt.format(img, layout, chunk_params=CHUNK)), "")


class TestLibraryLists(unittest.TestCase):
    """The package's names and structs come from the library."""

    def test_errors_are_the_librarys(self):
        lib = ckpt._abi._lib
        self.assertEqual(len(ckpt.ERRORS), lib.ckpt_abi_count(b"errors"))
        for code, name in enumerate(ckpt.ERRORS):
            self.assertEqual(name, lib.ckpt_err_name(code).decode())
        self.assertEqual(ckpt.ERRORS[:2], ["OK", "E_INVAL"])
        self.assertEqual(ckpt.ERRORS[-1], "E_ROLLBACK")
        e = ckpt.CkptError(ckpt.ERRORS.index("E_TWICE"), "x")
        self.assertEqual(e.name, "E_TWICE")

    def test_dtypes_are_the_librarys(self):
        self.assertEqual(ckpt._abi._DTYPES, {"fp16": 1, "bf16": 2})
        with tempdir() as d:
            with self.assertRaises(ckpt.CkptError) as cm:
                ckpt.format(os.path.join(d, "x"), ckpt.Layout().add("w", 4), dtype="fp32")
            self.assertEqual(cm.exception.name, "E_DTYPE")
            self.assertIn("'fp16'", cm.exception.message)

    def test_struct_sizes_checked(self):
        import ctypes
        for cname, mirror in [("ckpt_info", ckpt._abi._Info), ("ckpt_tensor_info", ckpt._abi._TensorInfo),
                              ("ckpt_group_hparams", ckpt._abi._HParams),
                              ("ckpt_device_status", ckpt._abi._Status), ("ckpt_traffic", ckpt._abi._Traffic)]:
            self.assertEqual(ckpt._abi._lib.ckpt_abi_sizeof(cname.encode()), ctypes.sizeof(mirror), cname)
        self.assertEqual(ckpt._abi._lib.ckpt_abi_sizeof(b"nonsense"), 0)
        # a mirror out of step fails the import
        import importlib.util
        spec = importlib.util.find_spec("ckpt._abi")
        with open(spec.origin) as f:  # noqa: PTH123
            src = f.read()
        broken = src.replace('("adam_l2", ctypes.c_int)]', '("adam_l2", ctypes.c_int), ("x", ctypes.c_uint64)]')
        self.assertNotEqual(src, broken)
        code = compile(broken, spec.origin, "exec")
        with self.assertRaisesRegex(ImportError, "ckpt_group_hparams"):
            exec(code, {"__file__": spec.origin, "__name__": "ckpt_broken"})  # noqa: S102


class TestStatusUuidExport(DeviceCase):
    def test_status_and_commit_result(self):
        with ckpt.open(self.path) as dev:
            st = dev.status()
            self.assertEqual((st["state"], st["last_result"], st["dtype"]), ("idle", "none", "bf16"))
            self.assertEqual(st["chunk_params"], CHUNK)
            self.assertEqual(st["n_chunks"], 64 + 1)
            dev.begin(GROUPS)
            self.assertEqual(dev.status()["state"], "open")
            grad = np.zeros(1000, np.uint16)
            grad[3] = 0x7F80  # +inf in bf16: the step is skipped
            dev.write_grad("b", grad)
            dev.write_grad("w", np.zeros((256, 1024), np.uint16))
            self.assertEqual(dev.commit(), "overflow")
            st = dev.status()
            self.assertEqual((st["last_result"], st["steps_skipped"]), ("overflow", 1))
            dev.begin(GROUPS)
            dev.write_grad("b", np.zeros(1000, np.uint16))
            dev.write_grad("w", np.zeros((256, 1024), np.uint16))
            self.assertEqual(dev.commit(), "committed")

    def test_prometheus_text_parses_with_prometheus_client(self):
        """Device.prometheus(): the status in Prometheus' text format, as
        Prometheus' own parser (prometheus_client) reads it: every family of
        the status line, counters and gauges, the samples status() gives,
        the labels back as given (quote, backslash, newline escaped)."""
        from prometheus_client.parser import text_string_to_metric_families
        odd = 'job "a\\b"\nnext'
        with ckpt.open(self.path) as dev:
            dev.begin(GROUPS)
            dev.write_grad("b", np.zeros(1000, np.uint16))
            dev.write_grad("w", np.zeros((256, 1024), np.uint16))
            self.assertEqual(dev.commit(), "committed")
            st = dev.status()
            text = dev.prometheus(name="trainer-0", job=odd)
            for bad in ({"1x": "a"}, {"__name": "a"}, {"a-b": "a"}, {"name": 3}):
                with self.assertRaises(ckpt.CkptError, msg=repr(bad)) as cm:
                    dev.prometheus(**bad)
                self.assertEqual(cm.exception.name, "E_INVAL")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        # the parser names a counter's family without _total
        self.assertEqual(families["dm_ckpt_steps_committed"].type, "counter")
        self.assertEqual(families["dm_ckpt_committed_step"].type, "gauge")
        values = {}
        for f in families.values():
            for s in f.samples:
                self.assertEqual((s.labels["name"], s.labels["job"]), ("trainer-0", odd), s)
                key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items())
                                       if k not in ("name", "job"))
                values[key] = s.value
        self.assertEqual(values["dm_ckpt_committed_step"], st["committed_step"])
        self.assertEqual(values["dm_ckpt_steps_committed_total"], st["steps_committed"])
        self.assertEqual(values["dm_ckpt_grad_bytes_total"], st["grad_bytes"])
        self.assertEqual(values["dm_ckpt_chunks"], st["n_chunks"])
        self.assertEqual(values["dm_ckpt_state,state=idle"], 1)
        self.assertEqual(values["dm_ckpt_state,state=open"], 0)
        self.assertEqual(values["dm_ckpt_last_result,result=committed"], 1)
        # a family per field of the dm status line, and the chunks
        self.assertEqual(len(families), ckpt._abi._lib.ckpt_abi_count(b"status_fields") + 1)

    def test_uuid(self):
        u = ckpt.image_uuid(self.path)
        self.assertRegex(u, r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
        with open(self.path, "rb") as f:  # noqa: PTH123
            head = f.read(8192)
        # struct ckpt_sb_disk: magic "CKPT" at 0, uuid at 32, copies at 0 and 4 KiB
        copies = [head[o + 32:o + 48].hex() for o in (0, 4096) if head[o:o + 4] == b"CKPT"]
        self.assertTrue(copies)
        self.assertEqual({u.replace("-", "")}, set(copies))
        with ckpt.open(self.path) as dev:
            self.assertEqual(dev.uuid(), u)
        with self.assertRaises(ckpt.CkptError):
            ckpt.image_uuid(os.path.join(self._tmp.name, "missing"))

    def test_export_round_trip(self):
        from ckpt import safetensors
        rng = np.random.default_rng(1)
        with ckpt.open(self.path) as dev:
            dev.begin(GROUPS)
            for n, s in TENSORS:
                dev.write_grad(n, (rng.standard_normal(s).astype(np.float32).view(np.uint32) >> 16)
                               .astype(np.uint16))
            self.assertEqual(dev.commit(b"\x01trainer"), "committed")
            want = {n: dev.read_state(n) for n, _ in TENSORS}
            lowp = {n: dev.read_params(n) for n, _ in TENSORS}
            out = os.path.join(self._tmp.name, "all.safetensors")
            self.assertEqual(dev.export(out, with_optimizer=True, metadata={"run": 7}), out)
            arrays, dtypes, meta = safetensors.load_file(out, with_metadata=True)
            self.assertEqual(meta["step"], "1")
            self.assertEqual(meta["ckpt.dtype"], "bf16")
            self.assertEqual(meta["ckpt.uuid"], dev.uuid())
            self.assertEqual(meta["ckpt.trainer_blob"], b"\x01trainer".hex())
            self.assertEqual(meta["run"], "7")
            self.assertEqual(set(dtypes.values()), {"F32"})
            for n, _ in TENSORS:
                p, m, v = want[n]
                self.assertTrue(np.array_equal(arrays[n], p), n)
                self.assertTrue(np.array_equal(arrays[n + ".exp_avg"], m), n)
                self.assertTrue(np.array_equal(arrays[n + ".exp_avg_sq"], v), n)
                self.assertTrue(np.any(m != 0), n)
            out2 = os.path.join(self._tmp.name, "lo.safetensors")
            dev.export(out2, what="lowp", metadata={"step": "override"})
            arrays, dtypes, meta = safetensors.load_file(out2, with_metadata=True)
            self.assertEqual(set(dtypes.values()), {"BF16"})
            self.assertEqual((meta["ckpt.params"], meta["step"]), ("lowp", "override"))
            self.assertNotIn("ckpt.trainer_blob", meta)
            for n, _ in TENSORS:
                self.assertTrue(np.array_equal(arrays[n], lowp[n]), n)
            with self.assertRaises(ValueError):
                dev.export(out2, what="fp8")
            dev.begin(GROUPS)
            with self.assertRaises(ckpt.CkptError) as cm:
                dev.export(out2)
            self.assertEqual(cm.exception.name, "E_STATE")

    def test_safetensors_through_the_library(self):
        # ckpt.safetensors reads what the C++ reader validated, as read-only
        # memory maps; sharded checkpoints (an index, a model folder) too.
        import json
        from ckpt import safetensors
        d = self._tmp.name
        with ckpt.open(self.path) as dev:
            out = os.path.join(d, "all.safetensors")
            dev.export(out, with_optimizer=True)
            with self.assertRaises(ckpt.CkptError) as e:
                dev.export(out, metadata={"dm-ckpt.step": "9"})
            self.assertIn("exporter's", str(e.exception))
        whole, dtypes, meta = safetensors.load_file(out, with_metadata=True)
        self.assertEqual((meta["dm-ckpt.format_version"], meta["dm-ckpt.step"]), ("1", "0"))
        for a in whole.values():
            self.assertIsInstance(a, np.memmap)
            self.assertFalse(a.flags.writeable)
        # Two shards and an index, written here with json alone.
        names, wm = list(whole), {}
        for k, part in enumerate((names[:3], names[3:])):
            f = f"model-{k + 1:05d}-of-00002.safetensors"
            hdr, blobs, off = {"__metadata__": meta}, [], 0
            for n in part:
                b = np.ascontiguousarray(whole[n]).tobytes()
                hdr[n] = {"dtype": dtypes[n], "shape": list(whole[n].shape), "data_offsets": [off, off + len(b)]}
                off += len(b)
                blobs.append(b)
                wm[n] = f
            h = json.dumps(hdr).encode()
            with open(os.path.join(d, f), "wb") as fh:
                fh.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, fh)
        for src in (d, os.path.join(d, "model.safetensors.index.json")):
            shards = safetensors.load_file(src)
            self.assertEqual(list(shards), names)
            for n in names:
                self.assertTrue(np.array_equal(shards[n], whole[n]), n)
        with open(os.path.join(d, "bad.index.json"), "w") as fh:
            json.dump({"weight_map": dict(wm, **{names[0]: "../" + wm[names[0]]})}, fh)
        with self.assertRaises(ckpt.CkptError) as e:
            safetensors.load_file(os.path.join(d, "bad.index.json"))
        self.assertEqual(e.exception.name, "E_INVAL")
        self.assertIn("not a file name in the index's folder", str(e.exception))


class TestOpenFlags(DeviceCase):
    """ckpt_open_engine_flags: the param cache reads what the device holds
    (after the load and after a step, the same params as an engine without
    it); an unknown flag is refused with E_INVAL and opens nothing."""

    def test_param_cache_reads_the_same(self):
        with ckpt.open(self.path) as plain:
            want = plain.read_params("w").copy()
        with ckpt.open(self.path, param_cache=True) as dev:
            np.testing.assert_array_equal(dev.read_params("w"), want)
            dev.begin(GROUPS)
            for n, s in TENSORS:
                dev.write_grad(n, np.full(s, 0x3c00, np.uint16))
            dev.commit()
            after = dev.read_params("w").copy()
        self.assertFalse(np.array_equal(after, want))
        with ckpt.open(self.path) as plain:
            np.testing.assert_array_equal(plain.read_params("w"), after)

    def test_unknown_flag_is_refused(self):
        h = ctypes.c_void_p()
        ret = ckpt._abi._lib.ckpt_open_engine_flags(os.fsencode(self.path), 0, 0, 2, ctypes.byref(h))
        self.assertEqual(ckpt.ERRORS[-ret], "E_INVAL")
        self.assertIsNone(h.value)


if __name__ == "__main__":
    unittest.main()
