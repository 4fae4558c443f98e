"""The PASS/FAIL lines the Python halves of the VM tests print, one per
check; the guest's shell turns each into a TAP line (tests/tap.sh, checks)."""

failures = 0


def say(*a):
    print(*a, flush=True)


def check(what, cond, why=""):
    global failures
    if cond:
        say(f"PASS {what}")
    else:
        failures += 1
        say(f"FAIL {what}{': ' + why if why else ''}")
    return cond
