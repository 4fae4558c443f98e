#!/usr/bin/python3
"""Write a newc cpio archive (the initramfs format) from a spec, without root.

Spec lines (whitespace separated, '#' comments), read from stdin or a file:
  dir   GUESTPATH MODE
  file  GUESTPATH HOSTSRC [MODE]      (MODE defaults to the host file's mode)
  slink GUESTPATH TARGET
  nod   GUESTPATH MODE c|b MAJOR MINOR

The guest has merged /usr like Debian 12: GUESTPATHs under /lib, /lib64, /bin
and /sbin are stored under /usr/... (the top-level names are expected to be
symlinks made with slink; a directory entry would replace them).

Everything is owned by 0:0 with mtime 0, so the output only depends on the
inputs. Parent directories are created on demand; the first entry for a path
wins (later duplicates are skipped), so callers may list a library twice.
"""
import os
import stat
import sys

CHUNK = 1 << 20
USRMERGE = ("lib", "lib64", "bin", "sbin")


class Writer:
    def __init__(self, out):
        self.out = out
        self.ino = 300000
        self.seen = set()

    def _hdr(self, name, mode, size, nlink=1, rmaj=0, rmin=0):
        self.ino += 1
        name_b = name.encode() + b"\0"
        fields = (self.ino, mode, 0, 0, nlink, 0, size, 0, 0, rmaj, rmin,
                  len(name_b), 0)
        h = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.out.write(h + name_b)
        self._pad(len(h) + len(name_b))

    def _pad(self, n):
        if n % 4:
            self.out.write(b"\0" * (4 - n % 4))

    def _parents(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in self.seen:
                self.seen.add(d)
                self._hdr(d, stat.S_IFDIR | 0o755, 0, nlink=2)

    def _claim(self, path):
        path = path.strip("/")
        top = path.split("/", 1)
        if len(top) == 2 and top[0] in USRMERGE:
            path = "usr/" + path
        if not path or path in self.seen:
            return None
        self._parents(path)
        self.seen.add(path)
        return path

    def dir(self, path, mode):
        p = self._claim(path)
        if p:
            self._hdr(p, stat.S_IFDIR | mode, 0, nlink=2)

    def slink(self, path, target):
        p = self._claim(path)
        if p:
            t = target.encode()
            self._hdr(p, stat.S_IFLNK | 0o777, len(t))
            self.out.write(t)
            self._pad(len(t))

    def nod(self, path, mode, kind, major, minor):
        p = self._claim(path)
        if p:
            t = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
            self._hdr(p, t | mode, 0, rmaj=major, rmin=minor)

    def file(self, path, src, mode=None):
        p = self._claim(path)
        if not p:
            return
        st = os.stat(src)  # follows symlinks: the archive holds the content
        if mode is None:
            mode = stat.S_IMODE(st.st_mode)
        self._hdr(p, stat.S_IFREG | mode, st.st_size)
        with open(src, "rb") as f:
            left = st.st_size
            while left:
                b = f.read(min(CHUNK, left))
                if not b:
                    raise SystemExit(f"mkcpio: {src} shrank while reading")
                self.out.write(b)
                left -= len(b)
        self._pad(st.st_size)

    def trailer(self):
        self._hdr("TRAILER!!!", 0, 0)
        # pad the archive to 512 bytes so that archives concatenate cleanly
        pos = self.out.tell()
        if pos % 512:
            self.out.write(b"\0" * (512 - pos % 512))


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: mkcpio.py OUT.cpio [SPEC]  (spec on stdin if omitted)")
    spec = open(sys.argv[2]) if len(sys.argv) == 3 else sys.stdin
    tmp = f"{sys.argv[1]}.tmp.{os.getpid()}"
    with open(tmp, "wb") as out:
        w = Writer(out)
        for n, line in enumerate(spec, 1):
            f = line.split()
            if not f or f[0].startswith("#"):
                continue
            try:
                if f[0] == "dir":
                    w.dir(f[1], int(f[2], 8))
                elif f[0] == "file":
                    w.file(f[1], f[2], int(f[3], 8) if len(f) > 3 else None)
                elif f[0] == "slink":
                    w.slink(f[1], f[2])
                elif f[0] == "nod":
                    w.nod(f[1], int(f[2], 8), f[3], int(f[4]), int(f[5]))
                else:
                    raise ValueError(f"unknown entry type {f[0]!r}")
            except (IndexError, ValueError, OSError) as e:
                raise SystemExit(f"mkcpio: spec line {n}: {line.strip()}: {e}")
        w.trailer()
    os.replace(tmp, sys.argv[1])


if __name__ == "__main__":
    main()
