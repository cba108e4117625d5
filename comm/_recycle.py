"""Fresh tensors on CPU over memory that nobody holds any more, instead of memory the OS must fault in.

Results that a collective hands out (the rows received, a gradient) cannot come from a workspace
that the next call overwrites: the caller or autograd may keep them. But on CPU, glibc returns a
large freed block to the OS, so the next tensor of that size pays its page faults again (a memory
pass as costly as a loopback transfer of the same bytes). :class:`Recycler` is a small caching
allocator for those results: it keeps the storages of the tensors it handed out, and hands one out
again only once no tensor, view or saved tensor refers to it any more, which the storage's
reference count says exactly (a storage whose only reference is ours cannot be seen by anyone
else). It holds at most ``max_buffers`` storages of at most ``max_bytes`` bytes each per device;
requests beyond that get a plain ``torch.empty`` (so what it keeps after a burst is bounded: 512 MiB
per device by default, and :func:`~meshshard.comm.release_workspace` lets it go). GPUs have the
caching allocator of torch already: :meth:`Recycler.empty` is ``torch.empty`` there.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Recycler"]

_use_count = getattr(torch._C, "_storage_Use_Count", None)


class Recycler:
    """Storages handed out as fresh tensors, reused once nobody else holds them (CPU)."""

    def __init__(self, max_buffers: int = 4, max_bytes: int = 128 << 20) -> None:
        self.enabled = True  # False: always torch.empty (the path before recycling, for the benchmarks)
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self._storages: dict[torch.device, list[torch.UntypedStorage]] = {}

    @staticmethod
    def _free(storage: torch.UntypedStorage) -> bool:
        return _use_count is not None and _use_count(storage._cdata) == 1

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """``torch.empty(shape, dtype=dtype, device=device)``, uninitialised, on a recycled storage
        where one is free. The result is an ordinary tensor (no ``_base``) that owns a reference to
        its storage, so the storage is not reused while the result or any view of it lives."""
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if not self.enabled or device.type != "cpu" or _use_count is None or nbytes > self.max_bytes or nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=device)
        pool = self._storages.setdefault(device, [])
        free = [s for s in pool if self._free(s)]
        fits = [s for s in free if s.nbytes() >= nbytes]
        if fits:
            storage = min(fits, key=lambda s: s.nbytes())
        else:
            for s in free:  # too small for this request: let the allocator have them back
                pool.remove(s)
            if len(pool) >= self.max_buffers:
                return torch.empty(shape, dtype=dtype, device=device)
            storage = torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()
            pool.append(storage)
        return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape)

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """:meth:`empty`, zero-filled."""
        return self.empty(shape, dtype, device).zero_()

    def clear(self) -> None:
        """Forget every storage (those still in use live on with their tensors)."""
        self._storages.clear()
