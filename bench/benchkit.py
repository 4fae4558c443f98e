# SPDX-License-Identifier: MIT
"""What bench/step_bench.py and bench/e2e_bench.py share: medians with their
spread, and OffloadAdamW.last_step_bytes in words."""

import statistics


def spread(values):
    """(median, min, max) of a list of numbers."""
    return statistics.median(values), min(values), max(values)


def fmt_spread(values, scale=1.0, digits=1):
    """'median (min..max)' of values x scale."""
    med, lo, hi = spread(values)
    return f"{med * scale:.{digits}f} ({lo * scale:.{digits}f}..{hi * scale:.{digits}f})"


def bytes_line(b, params):
    """OffloadAdamW.last_step_bytes in words: gradient and param bytes per param,
    control bytes and status-page reads (a build without them says so)."""
    if not b:
        return "(not counted by this build)"
    parts = [f"grad {b['grad_written'] / params:.3f} B/param", f"params {b['params_read'] / params:.3f} B/param"]
    parts += [f"control {b['control']} B" if "control" in b else "control (not counted)",
              f"{b['status_reads']} status reads" if "status_reads" in b else "status reads (not counted)"]
    return ", ".join(parts)
