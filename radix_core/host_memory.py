"""The host allocator set for a server's steady state: glibc's malloc keeps what a forward frees for the next one.

By default glibc serves every allocation above a threshold (128 KiB, raised as large blocks are freed, at most
32 MiB) with its own `mmap` and returns it with `munmap`, and gives the freed top of a heap back to the kernel once
it exceeds twice that threshold. A CPU forward allocates and frees the same large activations batch after batch, so
each batch faults them in again: on 2 CPUs (torch 2.13, the `tiny` preset, a 1,000-document rerank as 7 batches on
one compute thread) 40,000-70,000 page faults and 0.65-0.68 s a rerank by default; with the settings below none
after the first and 0.55 s. The cost is resident memory: up to `TRIM_BYTES` freed at the top of a heap stays
mapped, as a GPU framework's caching allocator keeps device memory.

A process-wide setting, so the engine never sets it itself: the engine replica calls `keep_freed_memory` when it
starts; a program using `Engine` in-process may call it too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

# mallopt(3) parameters
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit: larger blocks are mapped one by one regardless
TRIM_BYTES = 1 << 30  # freed memory at a heap's top kept mapped
TOP_PAD_BYTES = 64 << 20  # extra memory taken whenever a heap grows


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory (fixed thresholds above); False where the C library is not glibc
    or refuses a setting (the allocator is left as it was for the refused ones)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None)
    if mallopt is None:  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = all([mallopt(M_MMAP_THRESHOLD, MMAP_BYTES), mallopt(M_TRIM_THRESHOLD, TRIM_BYTES),
                   mallopt(M_TOP_PAD, TOP_PAD_BYTES)])
    if not applied:
        logger.warning("the C library refused a malloc setting; the host allocator keeps its defaults")
    return applied
