"""A counting allocator for CPU tests, where there is no CUDA caching allocator to ask for
max_memory_allocated: a TorchDispatchMode that, while it is active, adds the bytes of every new
storage an aten op returns and takes them off when that storage dies (weakref.finalize on the
untyped storage, whose Python object torch keeps alive as long as the storage), keeping the current
and the peak bytes above the moment it started (or was last reset).

    with MemoryCounter() as counter:
        ...
    counter.peak, counter.current  # bytes above the start

What counts: each distinct storage (a view, an in-place op or an out= op makes none) returned by an
op dispatched while the mode is active, its whole nbytes, from the op's return until its last
reference dies, wherever that happens (the autograd engine runs CPU backwards on the caller's
thread, with the mode). What does not: storages that existed before (the inputs), scratch an op's
C++ kernel allocates and frees inside itself (a GEMM's packing buffers), tensors made without an
aten op (torch.from_numpy), memory outside torch's tensors (gloo's buffers, Python objects),
storages resized in place (counted at their first size), allocator rounding and caching (the CUDA
caching allocator rounds to 512 bytes and keeps freed blocks: these figures are what tensors hold, a
lower bound of what a caching allocator reserves). `transient()` marks a region whose inner peak is
not counted in `peak` (its allocations still count in `current`, so what it returns does): for
stand-ins of fused kernels, whose own temporaries are not the real kernels'.
"""

import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class MemoryCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self._live = {}  # data_ptr -> nbytes of the storages counted and still alive
        self.current = 0  # bytes of those, above the start
        self.peak = 0  # the most `current` has been outside transient regions
        self.transient_peak = 0  # the most `current` has been inside them
        self._transient = 0

    def reset_peak(self) -> int:
        """Makes the current bytes the new baseline of `peak` (a phase's start): returns them."""
        self.peak = self.current
        self.transient_peak = self.current
        return self.current

    @contextlib.contextmanager
    def transient(self):
        self._transient += 1
        try:
            yield
        finally:
            self._transient -= 1
            self.peak = max(self.peak, self.current)

    def _freed(self, ptr: int) -> None:
        # (weakref.finalize runs as the storage's Python object dies, before its memory is freed:
        # no other storage holds ptr yet)
        self.current -= self._live.pop(ptr, 0)

    def _count(self, t: torch.Tensor, inputs: set) -> None:
        storage = _storage(t)
        if storage is None:
            return
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or ptr in inputs or ptr in self._live:
            return
        self._live[ptr] = nbytes
        self.current += nbytes
        if self._transient:
            self.transient_peak = max(self.transient_peak, self.current)
        else:
            self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._freed, ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat_in, _ = tree_flatten((args, kwargs or {}))
        inputs = {s.data_ptr() for s in map(_storage, flat_in) if s is not None}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self._count(t, inputs)
        return out


def _storage(t):
    """t's untyped storage; None for what is not a tensor with one (a wrapper subclass, such as
    funcol's AsyncCollectiveTensor, whose inner tensor was counted when an op made it)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        storage = t.untyped_storage()
        storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return storage
