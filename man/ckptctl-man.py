#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""ckptctl.8.rst with its Commands section filled in from ckptctl's own
--help (every command's usage, description, options and examples), so the
man page lists exactly the commands of the ckptctl it is built with.

    ckptctl-man.py CKPTCTL TEMPLATE OUT [EMULATOR ARGS...]

(EMULATOR: what runs CKPTCTL in a cross build, e.g. qemu-aarch64 -L DIR.)
"""
import re
import subprocess
import sys


RUNNER = sys.argv[4:]


def help_text(ckptctl, *args):
    return subprocess.run([*RUNNER, ckptctl, *args, "--help"], check=True, capture_output=True,
                          text=True).stdout


def main():
    ckptctl, template, out = sys.argv[1:4]
    top = help_text(ckptctl)
    section = re.search(r"^Subcommands:\n(.*?)(?:\n\n|\Z)", top, re.M | re.S)
    if not section:
        sys.exit(f"ckptctl-man.py: no 'Subcommands:' in {ckptctl} --help")
    commands = re.findall(r"^  ([a-z][a-z0-9-]*)\s", section.group(1), re.M)
    parts = []
    for cmd in commands:
        text = help_text(ckptctl, cmd).rstrip()
        body = "\n".join(("   " + line).rstrip() for line in text.splitlines())
        parts.append(f"{cmd}\n{'-' * len(cmd)}\n\n::\n\n{body}\n")
    rst = open(template).read()
    if ".. ckptctl-commands" not in rst:
        sys.exit(f"ckptctl-man.py: {template} has no '.. ckptctl-commands' line")
    with open(out, "w") as f:
        f.write(rst.replace(".. ckptctl-commands\n", "\n".join(parts)))


if __name__ == "__main__":
    main()
