"""Timing of one kernel on the probed device: warm-up calls, then the median of timed calls. On a GPU
(CUDA or ROCm builds of PyTorch) each call is bracketed by device events, so host work between calls
(the L2 flush that keeps weights cold) is not counted; on the CPU a wall clock brackets each call."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from planner.units import MS

__all__ = ["Device", "open_device"]

L2_FLUSH_MULTIPLE = 2  # the flush buffer is this many times the L2 cache: nothing of the last call survives it
DEFAULT_FLUSH_BYTES = 256 * 2**20  # when the device does not report its L2 size


@dataclass
class Device:
    """The device the probe measures on, and how many warm-up and timed calls each shape gets."""

    torch_device: torch.device
    warmup: int
    iterations: int
    flush_bytes: int
    _flush: torch.Tensor | None = None

    @property
    def is_gpu(self) -> bool:
        return self.torch_device.type == "cuda"  # ROCm builds of PyTorch use the "cuda" device type too

    def flush_l2(self) -> None:
        """Overwrite a buffer larger than the L2 cache, so the next call reads its operands from HBM."""
        if not self.is_gpu:
            return
        if self._flush is None:
            self._flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.torch_device)
        self._flush.zero_()

    def median_s(self, call: Callable[[], object], cold: bool = False) -> float:
        """The median time of `call` in seconds (`cold`: the L2 cache flushed before every call)."""
        for _ in range(self.warmup):
            call()
        if not self.is_gpu:
            times = []
            for _ in range(self.iterations):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            return statistics.median(times)
        pairs = []
        for _ in range(self.iterations):
            if cold:
                self.flush_l2()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(self.torch_device)
        return statistics.median(s.elapsed_time(e) for s, e in pairs) * MS


def open_device(smoke: bool, warmup: int, iterations: int) -> Device:
    """The first GPU when PyTorch sees one (and this is not a smoke run), else the CPU."""
    if not smoke and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
        return Device(device, warmup, iterations, max(DEFAULT_FLUSH_BYTES, L2_FLUSH_MULTIPLE * int(l2)))
    torch.set_num_threads(1)  # small CPU kernels on a shared machine: more threads only wait for each other
    return Device(torch.device("cpu"), warmup, iterations, 0)
