"""Memory bandwidth of this device: the floor every op is measured against."""

import torch
from benchlib import CUDA, DEVICE


def test_copy_bandwidth(bench):
    n = (2 << 30) if CUDA else (64 << 20)  # bf16 elements: 4 GiB on the GPU, 128 MiB on the CPU
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    # read + write counted, as the DESIGN anchors do
    bench(lambda: dst.copy_(src), group="copy", impl="copy", bytes_read=2 * src.nbytes)


def test_read_bandwidth(bench):
    n = (4 << 30) if CUDA else (64 << 20)
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE).normal_()
    bench(lambda: src.sum(), group="read", impl="sum", bytes_read=src.nbytes)
