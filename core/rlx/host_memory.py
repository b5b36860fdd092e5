"""How the process's memory is handed to CPU tensors: freed blocks kept for reuse, and
large tensors on huge pages.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold
(128 KiB at first, moved up only as freed blocks show it too low) with fresh pages from the
kernel and unmaps them when the tensor dies, and it returns the free top of its heap past
a trim threshold: every activation, gradient and logits tensor of a CPU training step then
faults its pages in again. Keeping freed blocks of up to 32 MiB for reuse took W0's update
from 0.44 s to 0.36 s (``benchmarks/cpu_w0.py``). Blocks above that size are still mapped
and unmapped one by one, so a large model's tensors are given back as before.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP, TRIM = 32 << 20, 512 << 20


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to 32 MiB for reuse (the free top of the
    heap up to 512 MiB). Returns whether it applied: glibc on Linux only."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):  # musl's mallopt does nothing
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM))


def huge_pages_for_large_tensors() -> bool:
    """Have PyTorch put CPU tensors of 2 MiB and more on transparent huge pages (its
    ``THP_MEM_ALLOC_ENABLE``), unless the environment already says otherwise. With 4 KiB
    pages, a decode step's cache writes and an update's passes over activations of a few
    MiB miss the TLB page after page: huge pages took W0's step from 0.56 s to 0.54 s.
    PyTorch reads the setting at its first allocation, so this must run before torch is
    imported (the ``rlx`` command does it first thing); processes started later (Ray
    actors, vLLM's workers) inherit it. Returns whether it can still take effect here."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return "torch" not in sys.modules
