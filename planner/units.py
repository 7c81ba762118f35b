"""Unit conversions used at the edges (data files, CLI output). Inside `planner/` every quantity is
in SI base units with the unit in its name; these helpers are the only place factors appear."""

__all__ = [
    "BILLION",
    "GB",
    "GIB",
    "HOURS_PER_MONTH",
    "MB",
    "MIB",
    "MS",
    "SECONDS_PER_DAY",
    "SECONDS_PER_HOUR",
    "SECONDS_PER_MINUTE",
    "TB",
    "TFLOP",
    "TOKENS_PER_MILLION",
    "US",
    "format_bytes",
    "format_duration",
    "format_rate",
    "format_seconds",
    "format_usd",
]

GB = 1e9  # bytes in a decimal gigabyte (vendors quote HBM and link bandwidth in these)
MB = 1e6  # bytes in a decimal megabyte (vendors quote cache sizes in these)
GIB = 2.0**30  # bytes in a binary gibibyte
MIB = 2.0**20  # bytes in a binary mebibyte (nvidia-smi reports memory in these)
TB = 1e12  # bytes in a decimal terabyte
MS = 1e-3  # seconds in a millisecond
US = 1e-6  # seconds in a microsecond
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_MINUTE = 60.0
SECONDS_PER_DAY = 86400.0
HOURS_PER_MONTH = 730.0  # the cloud billing month (8,760 h / 12)
TFLOP = 1e12  # FLOP in a teraFLOP (datasheets quote TFLOP/s)
TOKENS_PER_MILLION = 1e6  # prices are quoted per million tokens
BILLION = 1e9  # parameter counts are quoted in billions


def format_bytes(n_bytes: float) -> str:
    """Human-readable decimal bytes: 1.34 TB, 80.0 GB, 512 MB."""
    for unit, factor in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= factor:
            return f"{n_bytes / factor:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def format_seconds(seconds: float) -> str:
    """Human-readable duration: 12.3 ms, 450 us, 2.10 s."""
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds / 1e-3:.3g} ms"
    return f"{seconds / 1e-6:.3g} us"


def format_rate(per_s: float) -> str:
    """Human-readable rate with SI prefix: 12.3k/s."""
    for prefix, factor in (("M", 1e6), ("k", 1e3)):
        if abs(per_s) >= factor:
            return f"{per_s / factor:.3g}{prefix}/s"
    return f"{per_s:.3g}/s"


def format_usd(usd: float) -> str:
    return f"${usd:,.4g}" if abs(usd) < 1000 else f"${usd:,.0f}"


def format_duration(seconds: float) -> str:
    """Long durations in the unit that reads best: 2.7 min, 9.8 h, 3.2 d; short ones as format_seconds."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 2 * SECONDS_PER_HOUR:
        return f"{seconds / SECONDS_PER_HOUR:.1f} h"
    if seconds >= 2 * SECONDS_PER_MINUTE:
        return f"{seconds / SECONDS_PER_MINUTE:.1f} min"
    return format_seconds(seconds)
