"""Live tensor bytes on the CPU backend: a dispatch-level tracker with a peak and an optional cap.

The CPU has no caching allocator whose statistics could stand in for ``torch.cuda.max_memory_allocated``,
so :class:`LiveTensorTracker` counts what is alive, the way PyTorch's ``MemTracker``
(``torch/distributed/_tools/mem_tracker.py``) does: a ``TorchDispatchMode`` sees the output of every
aten op, takes each output's untyped storage and counts its ``nbytes()`` once (a storage is keyed by
its identity; PyTorch preserves one Python object per storage for the storage's lifetime, so views,
in-place results and ``t.data`` aliases of a storage never count twice), and a weak reference with a
callback on the storage subtracts the bytes when the storage is freed. ``UntypedStorage.resize_``
bypasses the dispatcher (ZeRO-3 frees and refills partitions with it), so it is patched while tracking,
as MemTracker does. Storages alive before tracking started are added by :meth:`track_existing`, which
walks the garbage collector's tensors (parameters, optimizer states, buffers).

What it does not see: memory outside tensor storages (the Python heap, DeepSpeed's C++ op workspaces,
gloo buffers, the allocator's own rounding and fragmentation), tensors created in other threads while
the mode is active only in this one, and two storages that alias the same memory (``from_numpy`` of one
array twice) count twice. On the CPU backend "device" and "host" are the same memory: offloaded
optimizer states count as live bytes too.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveTensorTracker", "ProbeOOM"]


class ProbeOOM(MemoryError):
    """Live tensor bytes would pass the probe's memory cap: the CPU stand-in for a CUDA out-of-memory."""


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: LiveTensorTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten(out)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                self.tracker.add(leaf)
        return out


class LiveTensorTracker:
    """Counts live tensor-storage bytes on ``device_types`` while active (``with tracker:``).

    ``current`` is what is alive now, ``peak`` the most seen since the last :meth:`reset_peak` (or since
    creation). With ``cap_bytes`` set, an allocation that would take ``current`` above the cap raises
    :class:`ProbeOOM` (the op has run; its output is dropped as the error unwinds, so ``current`` stays
    consistent). Re-entrant use and nesting are not supported: one tracker, one ``with`` block.
    """

    def __init__(self, cap_bytes: int | None = None, device_types: Iterable[str] = ("cpu",)) -> None:
        self.cap_bytes = cap_bytes
        self.device_types = frozenset(device_types)
        self.current = 0
        self.peak = 0
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self._lock = threading.RLock()
        self._mode: _Mode | None = None
        self._orig_resize: Any = None

    # --- the public face -------------------------------------------------------------------------

    def __enter__(self) -> LiveTensorTracker:
        if self._mode is not None:
            raise RuntimeError("LiveTensorTracker is already active")
        self._patch_resize()
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        mode, self._mode = self._mode, None
        try:
            if mode is not None:
                mode.__exit__(*exc)
        finally:
            self._restore_resize()

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes (the start of a phase)."""
        with self._lock:
            self.peak = self.current

    @property
    def storages(self) -> int:
        """How many storages are counted now."""
        return len(self._live)

    def track_existing(self, objects: Iterable[Any] | None = None) -> int:
        """Count the storages of tensors that exist already (default: every tensor the GC knows).

        Returns the bytes added. Parameters, buffers and optimizer states built before tracking started
        are found this way; a storage already counted is not counted again.
        """
        before = self.current
        for obj in gc.get_objects() if objects is None else objects:
            if issubclass(type(obj), torch.Tensor):  # type(), not isinstance: no __class__ lookups on proxies
                self.add(obj)
        return self.current - before

    def add(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage if it is new (or re-size it if it changed); may raise ProbeOOM."""
        storage = _storage(tensor)
        if storage is None or storage.device.type not in self.device_types:
            return
        nbytes = storage.nbytes()
        key = id(storage)
        with self._lock:
            entry = self._live.get(key)
            if entry is not None and entry[0]() is storage:
                if entry[1] != nbytes:
                    self._resize(key, storage, entry, nbytes)
                return
            if nbytes == 0:
                return
            self._grow(nbytes)
            ref = weakref.ref(storage, self._make_release(key))
            self._live[key] = (ref, nbytes)

    # --- internals -------------------------------------------------------------------------------

    def _grow(self, nbytes: int) -> None:
        total = self.current + nbytes
        if self.cap_bytes is not None and nbytes > 0 and total > self.cap_bytes:
            raise ProbeOOM(
                f"probe memory cap: allocating {nbytes} bytes would bring live tensors to {total} bytes, "
                f"over the cap of {self.cap_bytes} bytes"
            )
        self.current = total
        if total > self.peak:
            self.peak = total

    def _resize(self, key: int, storage: Any, entry: tuple[weakref.ref, int], nbytes: int) -> None:
        self._grow(nbytes - entry[1])
        if nbytes == 0:
            self._live.pop(key, None)
        else:
            self._live[key] = (entry[0], nbytes)

    def _make_release(self, key: int) -> Any:
        def release(ref: weakref.ref) -> None:
            with self._lock:
                entry = self._live.get(key)
                if entry is not None and entry[0] is ref:
                    del self._live[key]
                    self.current -= entry[1]

        return release

    def _patch_resize(self) -> None:
        tracker = self
        original = torch.UntypedStorage.resize_
        self._orig_resize = original

        def resize_(storage: Any, size: int) -> Any:
            result = original(storage, size)
            if storage.device.type in tracker.device_types:
                key = id(storage)
                with tracker._lock:
                    entry = tracker._live.get(key)
                    if entry is not None and entry[0]() is storage:
                        if entry[1] != storage.nbytes():
                            tracker._resize(key, storage, entry, storage.nbytes())
                    elif storage.nbytes() > 0:
                        tracker._grow(storage.nbytes())
                        tracker._live[key] = (weakref.ref(storage, tracker._make_release(key)), storage.nbytes())
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def _restore_resize(self) -> None:
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            self._orig_resize = None


def _storage(tensor: torch.Tensor) -> Any:
    """The untyped storage behind ``tensor``, or None for tensors without one (meta, sparse, nested)."""
    if tensor.is_meta or tensor.is_sparse or tensor.is_nested:
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
