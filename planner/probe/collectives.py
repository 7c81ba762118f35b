"""Collectives through torch.distributed: one process per device (NCCL on CUDA, RCCL on ROCm, both
under PyTorch's "nccl" backend; gloo for a CPU run), each timing all-reduce, all-gather and
all-to-all over a range of message sizes. Rank 0's medians are returned. A message size is the
element count of the buffer every rank ends with (as nccl-tests counts it), 16-bit elements."""

import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from planner.probe.timing import Device

__all__ = ["OPS", "collective_rows"]

OPS = ("all_reduce", "all_gather", "alltoall")  # the op names calibrate reads (aiconfigurator's nccl table)
HALF = torch.bfloat16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _op(name: str, elements: int, world: int, dev: torch.device):
    """A callable running collective `name` on a buffer of `elements` per rank."""
    out = torch.zeros(elements, dtype=HALF, device=dev)
    if name == "all_reduce":
        return lambda: dist.all_reduce(out)
    part = torch.ones(elements // world, dtype=HALF, device=dev)
    if name == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, part)
    src = torch.ones(elements, dtype=HALF, device=dev)
    return lambda: dist.all_to_all_single(out, src)


def _worker(rank: int, world: int, port: int, gpu: bool, sizes: list[int], warmup: int, iterations: int, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    device = Device(torch.device("cuda", rank) if gpu else torch.device("cpu"), warmup, iterations, 0)
    rows = []
    try:
        for name in OPS:
            for elements in sizes:
                elements -= elements % world
                call = _op(name, elements, world, device.torch_device)
                dist.barrier()
                rows.append({"op_name": name, "message_size": elements, "latency_s": device.median_s(call, graphed=False)})
    finally:
        dist.destroy_process_group()
    if rank == 0:
        torch.save(rows, result)


def collective_rows(device: Device, ranks: int, sizes: list[int]) -> list[dict]:
    """Each op at each size over `ranks` processes: dicts of op_name, message_size, latency_s."""
    with tempfile.TemporaryDirectory(prefix="planner-probe-") as scratch:
        result = str(Path(scratch) / "rows.pt")
        mp.spawn(_worker, args=(ranks, _free_port(), device.is_gpu, sizes, device.warmup, device.iterations, result), nprocs=ranks)
        return torch.load(result)
