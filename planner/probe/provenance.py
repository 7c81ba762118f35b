"""What a probe ran on: device, driver, library versions and clocks, as `probe.yaml` records them
(calibrate copies them into the user catalog as the source of its curves)."""

import datetime
import importlib.metadata
import platform
import re
import shutil
import subprocess

import torch

from planner.probe.timing import MAX_COPIES, SPIN_S, Device
from planner.units import MIB

__all__ = ["parse_throttle_counters", "provenance", "throttle_counters_us", "throttled_us"]

SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.limit", "pstate")
SMI_TIMEOUT_S = 10.0
OPTIONAL_LIBRARIES = ("flashinfer-python", "flashinfer", "flash-attn", "triton")


def _smi_output(tool: str, *args: str) -> str | None:
    """What `tool` (nvidia-smi, rocm-smi) prints with `args`; None where it is absent or fails."""
    smi = shutil.which(tool)
    if smi is None:
        return None
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_smi(index: int) -> dict[str, str]:
    """Driver and clocks from nvidia-smi (MHz, W as it prints them); {} where it is absent."""
    text = _smi_output("nvidia-smi", f"--id={index}", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader")
    if text is None:
        return {}
    values = [v.strip() for v in text.strip().split(",")]
    return dict(zip(SMI_FIELDS, values, strict=False)) if len(values) == len(SMI_FIELDS) else {}


THROTTLE_SECTION = "Clocks Event Reasons Counters"  # nvidia-smi -q -d PERFORMANCE: microseconds throttled since boot, by reason
THROTTLE_LINE = re.compile(r"^\s+(\S.*?)\s*:\s*(\d+)\s*us\s*$")


def parse_throttle_counters(text: str) -> dict[str, float]:
    """The counters of `nvidia-smi -q -d PERFORMANCE`'s "Clocks Event Reasons Counters" section, in
    microseconds by reason ({} where the section is absent: older drivers, other vendors)."""
    out: dict[str, float] = {}
    inside = False
    for line in text.splitlines():
        if line.strip() == THROTTLE_SECTION:
            inside = True
        elif inside and (found := THROTTLE_LINE.match(line)):
            out[found.group(1)] = float(found.group(2))
        elif inside and line.strip():
            break
    return out


def throttle_counters_us(device: Device) -> dict[str, float]:
    """The device's cumulative clock-throttling counters (microseconds by reason; {} off NVIDIA GPUs)."""
    if not device.is_gpu or torch.version.hip:
        return {}
    text = _smi_output("nvidia-smi", f"--id={device.torch_device.index or 0}", "-q", "-d", "PERFORMANCE")
    return {} if text is None else parse_throttle_counters(text)


def throttled_us(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Microseconds the device spent throttled between two readings, by reason, where it did."""
    return {reason: after[reason] - before[reason] for reason in after if reason in before and after[reason] > before[reason]}


def _rocm_smi() -> dict[str, str]:
    """The ROCm driver's clocks as rocm-smi prints them; {} where it is absent."""
    text = _smi_output("rocm-smi", "--showclocks", "--showdriverversion")
    if text is None:
        return {}
    return {"rocm_smi": " | ".join(line.strip() for line in text.splitlines() if ":" in line)}


def _libraries() -> dict[str, str]:
    found = {"torch": str(torch.__version__)}
    for name in OPTIONAL_LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def provenance(device: Device, backends: dict[str, str]) -> dict:
    """The probe's record of its machine: device, counts, versions, clocks, the attention backends used."""
    record: dict = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "host": platform.node(),
                    "python": platform.python_version(), "libraries": _libraries(), "backends": backends,
                    "warmup_calls": device.warmup, "timed_calls": device.iterations, "statistic": "median"}
    if device.is_gpu:
        method = "CUDA graph of K calls on K operand copies (cold in L2), over K, between device events; the device held busy before each start"
        record["timing"] = {"method": method, "max_copies": MAX_COPIES, "spin_s": SPIN_S, "calls_not_captured": device.eager_calls}
    if not device.is_gpu:
        return record | {"device": f"CPU ({platform.processor() or platform.machine()})", "device_type": "cpu", "device_count": 1,
                         "threads": torch.get_num_threads()}
    index = device.torch_device.index or 0
    props = torch.cuda.get_device_properties(index)
    record |= {"device": props.name, "device_type": "rocm" if torch.version.hip else "cuda", "device_count": torch.cuda.device_count(),
               "memory_mib": round(props.total_memory / MIB), "multiprocessors": props.multi_processor_count,
               "compute_capability": f"{props.major}.{props.minor}", "runtime": torch.version.hip or torch.version.cuda,
               "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0) or 0)}
    if torch.backends.cudnn.is_available():
        record["libraries"]["cudnn"] = str(torch.backends.cudnn.version())
    clocks = _rocm_smi() if torch.version.hip else _nvidia_smi(index)
    return record | ({"driver_and_clocks": clocks} if clocks else {})
