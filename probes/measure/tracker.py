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
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, KIND_INDEX, PHASE, AllocStream, Event

__all__ = ["LiveTensorTracker", "ProbeOOM"]


class ProbeOOM(MemoryError):
    """Live tensor bytes would pass the probe's memory cap: the CPU stand-in for a CUDA out-of-memory."""


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: LiveTensorTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        run_op = self.tracker.run_op
        out = func(*args, **(kwargs or {})) if run_op is None else run_op(func, args, kwargs)
        leaves, _ = tree_flatten(out)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                self.tracker.add(leaf)
        return out


_PARAMETERS, _GRADIENTS, _OPTIMIZER_STATES = (KIND_INDEX[k] for k in ("parameters", "gradients", "optimizer_states"))


class _Entry:
    """One counted storage: a weak reference to it, its bytes, and (when recording) its stream key and the
    index of its ALLOC event."""

    __slots__ = ("ref", "nbytes", "key", "event")

    def __init__(self, ref: weakref.ref, nbytes: int, key: int = 0, event: int = -1) -> None:
        self.ref, self.nbytes, self.key, self.event = ref, nbytes, key, event


class LiveTensorTracker:
    """Counts live tensor-storage bytes on ``device_types`` while active (``with tracker:``).

    ``current`` is what is alive now, ``peak`` the most seen since the last :meth:`reset_peak` (or since
    creation). With ``cap_bytes`` set, an allocation that would take ``current`` above the cap raises
    :class:`ProbeOOM` (the op has run; its output is dropped as the error unwinds, so ``current`` stays
    consistent). With ``record_stream`` it keeps the allocation stream, :meth:`stream` (see the module
    docstring). ``run_op`` runs each op in place of calling it (a meta trace passes
    :func:`probes.measure.meta_results.run_meta_op`). Re-entrant use and nesting are not supported: one
    tracker, one ``with`` block.
    """

    def __init__(
        self,
        cap_bytes: int | None = None,
        device_types: Iterable[str] = ("cpu",),
        record_stream: bool = False,
        run_op: Callable[[Any, Any, Any], Any] | None = None,
    ) -> None:
        self.cap_bytes = cap_bytes
        self.run_op = run_op
        self.device_types = frozenset(device_types)
        self.current = 0
        self.peak = 0
        self.record_stream = record_stream
        self._live: dict[int, _Entry] = {}
        self._lock = threading.RLock()
        self._mode: _Mode | None = None
        self._orig_resize: Any = None
        self._events: list[Event] = []
        self._phases: list[str] = []
        self._next_key = 1

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

    def mark_phase(self, name: str, *, reset_peak: bool = False) -> int:
        """Append a PHASE marker ``name`` to the stream (when recording) and, with ``reset_peak``, start a
        new peak window there, in one step. Returns the peak of the window that ends here (before any reset).
        """
        with self._lock:
            ended = self.peak
            if self.record_stream:
                if name not in self._phases:
                    self._phases.append(name)
                self._events.append((PHASE, self._phases.index(name), 0, 0, 0))
            if reset_peak:
                self.peak = self.current
            return ended

    def mark_empty_cache(self) -> None:
        """Append an EMPTY_CACHE event where ``torch.cuda.empty_cache()`` runs (or would run, on the CPU)."""
        if self.record_stream:
            with self._lock:
                self._events.append((EMPTY_CACHE, 0, 0, 0, 0))

    def stream(self) -> AllocStream:
        """The allocation stream recorded so far (empty unless ``record_stream``)."""
        with self._lock:
            return AllocStream(tuple(self._events), tuple(self._phases))

    @property
    def storages(self) -> int:
        """How many storages are counted now."""
        return len(self._live)

    def track_existing(self, objects: Iterable[Any] | None = None) -> int:
        """Count the storages of tensors that exist already (default: every tensor the GC knows).

        Returns the bytes added. Parameters, buffers and optimizer states built before tracking started
        are found this way; a storage already counted is not counted again. When recording, the kinds of
        what it sees are labelled too (:meth:`label_kinds`).
        """
        before = self.current
        labels: dict[int, int] = {}
        roles: dict[type, int] = {}
        for obj in gc.get_objects() if objects is None else objects:
            kind = type(obj)  # type(), not isinstance: no __class__ lookups on proxies
            role = roles.get(kind)
            if role is None:
                role = roles[kind] = _role(kind)
            if role in (_IS_TENSOR, _IS_PARAMETER):
                self.add(obj)
            if role > _IS_TENSOR and self.record_stream:
                self._label_object(obj, role, labels)
        return self.current - before

    def label_kinds(self, objects: Iterable[Any] | None = None) -> int:
        """Label the ALLOC events of live storages by what holds them (best-effort, see the module docstring):
        parameters, their gradients, and the tensors in torch optimizers' state. Counts nothing; returns how
        many events were labelled. ``objects`` defaults to every object the GC knows."""
        if not self.record_stream:
            return 0
        labels: dict[int, int] = {}
        roles: dict[type, int] = {}
        for obj in gc.get_objects() if objects is None else objects:
            kind = type(obj)
            role = roles.get(kind)
            if role is None:
                role = roles[kind] = _role(kind)
            if role > _IS_TENSOR:
                self._label_object(obj, role, labels)
        return sum(labels.values())

    def add(self, tensor: torch.Tensor, kind: int = 0) -> None:
        """Count ``tensor``'s storage if it is new (or re-size it if it changed); may raise ProbeOOM.
        ``kind`` (an index of :data:`store.alloc_stream.KINDS`) labels its ALLOC when recording."""
        storage = _storage(tensor, "meta" in self.device_types)
        if storage is None or storage.device.type not in self.device_types:
            return
        nbytes = storage.nbytes()
        key = id(storage)
        with self._lock:
            entry = self._live.get(key)
            if entry is not None and entry.ref() is storage:
                if entry.nbytes != nbytes:
                    self._resize(key, entry, nbytes)
                return
            if nbytes == 0:
                return
            self._grow(nbytes)
            self._live[key] = self._new_entry(key, storage, nbytes, kind)

    def key_of(self, tensor: torch.Tensor) -> int | None:
        """The stream key of ``tensor``'s storage while it is counted (when recording), else None."""
        storage = _storage(tensor, "meta" in self.device_types)
        entry = self._live.get(id(storage)) if storage is not None else None
        if entry is None or entry.ref() is not storage or not self.record_stream:
            return None
        return entry.key

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

    def _new_entry(self, key: int, storage: Any, nbytes: int, kind: int = 0) -> _Entry:
        """The entry of a storage just counted (``_grow`` has run); records its ALLOC. Under the lock."""
        entry = _Entry(weakref.ref(storage, self._make_release(key)), nbytes)
        if self.record_stream:
            entry.key, entry.event = self._next_key, len(self._events)
            self._next_key += 1
            self._events.append((ALLOC, entry.key, nbytes, 0, kind))
        return entry

    def _resize(self, key: int, entry: _Entry, nbytes: int) -> None:
        """A counted storage changed size: the FREE of the old bytes, the ALLOC of the new. Under the lock."""
        self._grow(nbytes - entry.nbytes)
        if self.record_stream:
            self._events.append((FREE, entry.key, 0, 0, 0))
            if nbytes:
                kind = self._events[entry.event][4]
                entry.key, entry.event = self._next_key, len(self._events)
                self._next_key += 1
                self._events.append((ALLOC, entry.key, nbytes, 0, kind))
        if nbytes == 0:
            self._live.pop(key, None)
        else:
            entry.nbytes = nbytes

    def _make_release(self, key: int) -> Any:
        def release(ref: weakref.ref) -> None:
            with self._lock:
                entry = self._live.get(key)
                if entry is not None and entry.ref is ref:
                    del self._live[key]
                    self.current -= entry.nbytes
                    if self.record_stream:
                        self._events.append((FREE, entry.key, 0, 0, 0))

        return release

    def _label_object(self, obj: Any, role: int, labels: dict[int, int]) -> None:
        """Label what ``obj`` holds: a parameter and its gradient, or an optimizer's states."""
        if role == _IS_PARAMETER:
            self._label(obj, _PARAMETERS, labels)
            grad = obj.grad
            if grad is not None:
                self._label(grad, _GRADIENTS, labels)
        elif role == _IS_OPTIMIZER:
            for state in obj.state.values():
                for value in state.values() if isinstance(state, dict) else ():
                    if isinstance(value, torch.Tensor):
                        self._label(value, _OPTIMIZER_STATES, labels)

    def _label(self, tensor: Any, kind: int, labels: dict[int, int]) -> None:
        """Set ``kind`` on the latest ALLOC of ``tensor``'s storage, if it is counted."""
        storage = _storage(tensor)
        if storage is None:
            return
        with self._lock:
            entry = self._live.get(id(storage))
            if entry is None or entry.ref() is not storage or entry.event < 0:
                return
            op, key, size, stream, old = self._events[entry.event]
            if old != kind:
                self._events[entry.event] = (op, key, size, stream, kind)
                labels[kind] = labels.get(kind, 0) + 1

    def _patch_resize(self) -> None:
        tracker = self
        original = torch.UntypedStorage.resize_
        self._orig_resize = original

        def resize_(storage: Any, size: int) -> Any:
            result = original(storage, size)
            if storage.device.type in tracker.device_types:
                key = id(storage)
                nbytes = storage.nbytes()
                with tracker._lock:
                    entry = tracker._live.get(key)
                    if entry is not None and entry.ref() is storage:
                        if entry.nbytes != nbytes:
                            tracker._resize(key, entry, nbytes)
                    elif nbytes > 0:
                        tracker._grow(nbytes)
                        tracker._live[key] = tracker._new_entry(key, storage, nbytes)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def _restore_resize(self) -> None:
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            self._orig_resize = None


_IS_OTHER, _IS_TENSOR, _IS_PARAMETER, _IS_OPTIMIZER = 0, 1, 2, 3  # what track_existing and label_kinds see


def _role(kind: type) -> int:
    """What an object of type ``kind`` is to the tracker (asked once per type)."""
    if issubclass(kind, torch.nn.Parameter):
        return _IS_PARAMETER
    if issubclass(kind, torch.Tensor):
        return _IS_TENSOR
    return _IS_OPTIMIZER if issubclass(kind, torch.optim.Optimizer) else _IS_OTHER


def _storage(tensor: torch.Tensor, meta: bool = False) -> Any:
    """The untyped storage behind ``tensor``, or None for tensors without one (sparse, nested; meta tensors
    unless ``meta``: a tracker of ``device_types=("meta",)`` counts the bytes a traced step would hold)."""
    if (tensor.is_meta and not meta) or tensor.is_sparse or tensor.is_nested:
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
