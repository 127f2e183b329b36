"""The tensors each part of a step holds while its allocation stream is built (search.streams.build): made in
a part's pattern of sizes or by name, freed newest first or when no longer named, each recorded as it happens."""

from __future__ import annotations

import itertools

from search.model.moment_parts import Named, NamedTensors
from search.streams.sizes import (
    BACKWARD_FREED,
    BACKWARD_MADE,
    FORWARD_FREED,
    FORWARD_HELD,
    FORWARD_MADE,
    RECOMPUTE_FREED,
    RECOMPUTE_MADE,
)
from store.alloc_stream import KIND_INDEX, StreamBuilder


def _kind(part: str) -> str:
    """The stream's kind for a part or resident name (weights of any model count as parameters)."""
    part = part.removeprefix("resident:")
    if part in KIND_INDEX:
        return part
    weights = part in ("init", "ema") or part.endswith(("parameters", "_model"))  # reference_model, reward_model
    return "parameters" if weights else "other"


def _peak_index(made: tuple[int, ...], freed: tuple[int, ...]) -> int:
    """The index of the tensor after whose request a layer program's own tensors (``made``, freed as ``freed``
    says: 0 kept, else 1 + the index after which) hold the most bytes (the first such)."""
    live = peak = at = 0
    due: dict[int, int] = {}
    for i, size in enumerate(made):
        live += size
        if live > peak:
            peak, at = live, i
        if freed[i]:
            due[freed[i] - 1] = due.get(freed[i] - 1, 0) + size
        live -= due.pop(i, 0)
    return at


class Parts:
    """The tensors each part holds now (newest last, each with its name or "" for a part's patterned bytes),
    and the stream they are recorded into."""

    def __init__(self, out: StreamBuilder) -> None:
        self.out = out
        self.held: dict[str, list[tuple[int, int, str]]] = {}
        self.patterned: dict[str, tuple[int, int]] = {}  # part -> (bytes, tensors) of its patterned tensors
        self.named: dict[str, int] = {}  # part -> bytes of its named tensors

    def bytes(self, part: str) -> int:
        return self.patterned.get(part, (0, 0))[0] + self.named.get(part, 0)

    def _unnamed(self, part: str) -> int:
        return self.patterned.get(part, (0, 0))[0]

    def shrink(self, part: str, target: int) -> None:
        """Frees the part's patterned tensors, newest first, until they hold at most ``target`` bytes beside
        its named ones."""
        held = self.held.setdefault(part, [])
        total, count = self.patterned.get(part, (0, 0))
        i = len(held) - 1
        while i >= 0 and total > target:
            key, size, name = held[i]
            if not name:
                self.out.free(key)
                del held[i]
                total, count = total - size, count - 1
            i -= 1
        self.patterned[part] = (total, count)

    def release(self, part: str, keep: dict[str, Named]) -> None:
        """Frees the part's named tensors that ``keep`` does not name (a moment that no longer holds them),
        oldest first."""
        held = self.held.setdefault(part, [])
        if not self.named.get(part):
            return
        for entry in [e for e in held if e[2] and e[2] not in keep]:
            self.out.free(entry[0])
            held.remove(entry)
            self.named[part] -= entry[1]

    def grow(self, part: str, target: int, pattern: tuple[int, ...]) -> None:
        """Requests patterned tensors until they hold ``target`` bytes beside the part's named ones."""
        held = self.held.setdefault(part, [])
        total, i = self.patterned.get(part, (0, 0))
        missing = target - total
        pattern = pattern or (missing,)
        sizes, n = [], len(pattern)
        while missing > 0:
            size = pattern[i % n]
            if size > missing:  # min(size, missing)
                size = missing
            sizes.append(size)
            missing, total, i = missing - size, total + size, i + 1
        keys = self.out.alloc_run(sizes, _kind(part))
        held.extend([(key, size, "") for key, size in zip(keys, sizes, strict=True)])
        self.patterned[part] = (total, i)

    def run_forward(
        self, part: str, target: int, made: tuple[int, ...], freed: tuple[int, ...], over: tuple[int, ...] = ()
    ) -> None:
        """Grows an empty ``part`` to ``target`` bytes layer by layer as the layer's forward makes them
        (:func:`search.streams.sizes.layer_forward_program`): each tensor in order, a temporary freed once the
        tensor its code frees it after is made; the saved ones held as the part's patterned tensors. The bytes
        past the last whole layer (what is saved outside the layers) are requested as saved tensors only. The
        tensors ``over`` (what the decoder holds over its layers) are made first and freed after the layers."""
        held = self.held.setdefault(part, [])
        kind, layer = _kind(part), sum(size for size, order in zip(made, freed, strict=True) if order == 0)
        decoder_locals = [self.out.alloc(size, kind) for size in over]
        total = count = 0
        temporaries: dict[int, list[int]] = {}
        whole = True
        for j in itertools.count():
            if total >= target:
                break
            i = j % len(made)
            whole = whole if i else target - total >= layer
            size = made[i]
            if freed[i] == 0:
                size = min(size, target - total)
                held.append((self.out.alloc(size, kind), size, ""))
                total, count = total + size, count + 1
            elif whole:
                temporaries.setdefault(freed[i] - 1, []).append(self.out.alloc(size, kind))
            for key in temporaries.pop(i, []):
                self.out.free(key)
        for keys in temporaries.values():
            for key in keys:
                self.out.free(key)
        for key in decoder_locals:
            self.out.free(key)
        self.patterned[part] = (total, count)

    def run_program(
        self, part: str, target: int, made: tuple[int, ...], freed: tuple[int, ...], to_peak: bool = False
    ) -> None:
        """Runs a layer's program on ``part`` (which holds what came before it) toward ``target`` bytes: each
        tensor in order (``made``), one marked 0 in ``freed`` held as the part's patterned tensors, a temporary
        freed once the tensor its code frees it after is made. The part never holds more than ``target`` (the
        moment's bytes, which the cost model's peak counts): it stops before a tensor that would pass it (a held
        one is cut to it). The temporaries still alive at the end are freed then: a checkpointed layer's
        recompute (:func:`search.streams.sizes.recompute_program`), where torch's ``_StopRecomputationError``
        unwinds the layer's frames. ``to_peak``: stops instead once the program's own tensors are at their most
        (after the tensor made last before that) and holds those alive as the part's: a layer's backward
        (:func:`search.streams.sizes.layer_backward_program`) at the moment the cost model counts its peak."""
        held = self.held.setdefault(part, [])
        kind = _kind(part)
        total, count = self.patterned.get(part, (0, 0))
        end = _peak_index(made, freed) + 1 if to_peak else len(made)
        temporaries: dict[int, list[tuple[int, int]]] = {}
        alive = 0  # bytes of the temporaries alive
        for i in range(end):
            room = target - total - alive
            if room <= 0 or (freed[i] and made[i] > room):
                break
            if freed[i] == 0:
                size = min(made[i], room)
                held.append((self.out.alloc(size, kind), size, ""))
                total, count = total + size, count + 1
            else:
                temporaries.setdefault(freed[i] - 1, []).append((self.out.alloc(made[i], kind), made[i]))
                alive += made[i]
            if i < end - 1 or not to_peak:
                for key, size in temporaries.pop(i, []):
                    self.out.free(key)
                    alive -= size
        for entries in temporaries.values():
            for key, size in entries:
                if to_peak:  # alive at the peak: the part's now, freed newest first as it shrinks
                    held.append((key, size, ""))
                    total, count = total + size, count + 1
                else:
                    self.out.free(key)
        self.patterned[part] = (total, count)

    def make(self, part: str, named: dict[str, Named], sizes: dict[str, tuple[int, ...]]) -> None:
        """Requests the named tensors the part does not hold yet, in order; a name with a pattern in
        ``sizes`` is a group of tensors of those sizes (made together, freed together)."""
        held = self.held.setdefault(part, [])
        if not named:
            return
        have = {name for _, _, name in held if name}
        for name, tensor in named.items():
            size = tensor.size
            if name in have or size <= 0:
                continue
            pattern, i = sizes.get(name) or (size,), 0
            while size > 0:
                piece = min(pattern[i % len(pattern)], size)
                held.append((self.out.alloc(piece, _kind(part), tensor.stream), piece, name))
                self.named[part] = self.named.get(part, 0) + piece
                size -= piece
                i += 1

    def move(self, targets: dict[str, int], sizes: dict[str, tuple[int, ...]], named: NamedTensors = ()) -> None:
        """Frees first, then requests, until every part holds its target bytes: the tensors ``named`` names
        (:data:`search.model.moment_parts.NamedTensors`, held until a later move no longer names them; in the
        sizes of ``sizes[name]`` where that exists) and its pattern's tensors for the rest."""
        by_part: dict[str, dict[str, Named]] = {}
        for tensor in named:
            by_part.setdefault(tensor.part, {})[tensor.name] = tensor
        kept = {part: sum(t.size for t in keep.values()) for part, keep in by_part.items()}  # the named bytes
        no_names: dict[str, Named] = {}
        for part, target in targets.items():
            self.release(part, by_part.get(part, no_names))
            self.shrink(part, max(0, target - kept.get(part, 0)))
        for part, target in targets.items():
            keep = by_part.get(part, no_names)
            wanted = max(0, target - kept.get(part, 0))
            if part == "activations" and FORWARD_MADE in sizes and wanted and not self.bytes(part):
                self.run_forward(part, wanted, sizes[FORWARD_MADE], sizes[FORWARD_FREED], sizes.get(FORWARD_HELD, ()))
            else:
                # a backward growing what the forward left: the top layer's recompute (checkpointed) and backward
                if part == "activations" and 0 < self._unnamed(part) < wanted:
                    if RECOMPUTE_MADE in sizes:
                        self.run_program(part, wanted, sizes[RECOMPUTE_MADE], sizes[RECOMPUTE_FREED])
                    if BACKWARD_MADE in sizes:
                        self.run_program(part, wanted, sizes[BACKWARD_MADE], sizes[BACKWARD_FREED], to_peak=True)
                self.grow(part, wanted, sizes.get(part, ()))
            self.make(part, keep, sizes)
