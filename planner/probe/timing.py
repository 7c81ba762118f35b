"""Timing of one kernel on the probed device: warm-up calls, then the median of timed calls.

On a GPU (CUDA or ROCm builds of PyTorch) a kernel is timed as a decode step's kernels run: inside a
CUDA graph, back to back, each finding its operands cold in L2 (`rotated_s`). The graph holds K calls,
each on its own copy of the operands, K large enough that the copies span the flush size (at least
twice the L2 cache), so no call finds what the previous one read; the replay's time over K is one call's.
Before each replay the L2 cache is flushed and a spin kernel keeps the device busy for SPIN_S, so
the host has queued the replay before the device reaches it: host time is not counted, nor is the
graph's launch (spread over K calls). A call that cannot be captured is timed eagerly the same way.
On the CPU a wall clock brackets each call."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from planner.units import MS

__all__ = ["MAX_COPIES", "SPIN_S", "Device", "open_device", "operand_copies"]

L2_FLUSH_MULTIPLE = 2  # the flush buffer is this many times the L2 cache: nothing of the last call survives it
DEFAULT_FLUSH_BYTES = 256 * 2**20  # when the device does not report its L2 size
SPIN_S = 100e-6  # the device's busy wait before each timed call: longer than the host takes to queue a replay
SPIN_CLOCK_HZ = 2.0e9  # clock assumed to turn SPIN_S into cycles (a slower clock only spins longer)
MAX_COPIES = 256  # operand copies in one timed graph (K); tiny shapes span less than the flush size at this cap


def operand_copies(operand_bytes: int, flush_bytes: int) -> int:
    """K, the calls (each on its own operands) one timed graph holds: enough that their operands span
    `flush_bytes`, so that no call finds the previous ones' in L2; at least 1, at most MAX_COPIES."""
    return max(1, min(MAX_COPIES, -(-flush_bytes // max(1, operand_bytes))))


@dataclass
class Device:
    """The device the probe measures on, and how many warm-up and timed calls each shape gets."""

    torch_device: torch.device
    warmup: int
    iterations: int
    flush_bytes: int
    _flush: torch.Tensor | None = None
    eager_calls: int = 0  # timed calls that could not be captured as a CUDA graph (probe.yaml records the count)

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

    def _graphed(self, call: Callable[[], object]) -> Callable[[], object]:
        """`call` captured as a CUDA graph (its replay), or `call` itself where capture fails."""
        current = torch.cuda.current_stream(self.torch_device)
        side = torch.cuda.Stream(self.torch_device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # a warm-up off the capture stream, as capture asks
            call()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                call()
        except RuntimeError:
            torch.cuda.synchronize(self.torch_device)
            self.eager_calls += 1
            return call
        return graph.replay

    def rotated_s(self, make: Callable[[], Callable[[], object]]) -> float:
        """The median time of one call made by `make()` (which allocates its operands and returns the
        call), cold in L2, in seconds: on a GPU K calls on K copies of the operands in one graph, over K."""
        if not self.is_gpu:
            return self.median_s(make())
        before = torch.cuda.memory_allocated(self.torch_device)
        calls = [make()]
        copies = operand_copies(torch.cuda.memory_allocated(self.torch_device) - before, self.flush_bytes)
        calls += [make() for _ in range(copies - 1)]

        def every_copy() -> None:
            for call in calls:
                call()

        return self.median_s(every_copy, cold=True) / copies

    def median_s(self, call: Callable[[], object], cold: bool = False, graphed: bool = True) -> float:
        """The median time of `call` in seconds (`cold`: the L2 cache flushed before every call;
        `graphed`: replayed as a CUDA graph on a GPU; False where capture would change what is timed:
        collectives across processes, and a copy that capture would hand to a copy engine)."""
        for _ in range(self.warmup):
            call()
        if not self.is_gpu:
            times = []
            for _ in range(self.iterations):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            return statistics.median(times)
        timed = self._graphed(call) if graphed else call
        spin_cycles = int(SPIN_S * SPIN_CLOCK_HZ)
        pairs = []
        for _ in range(self.iterations):
            if cold:
                self.flush_l2()
            torch.cuda._sleep(spin_cycles)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            timed()
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
