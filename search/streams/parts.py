"""The tensors each part of a step holds while its allocation stream is built (search.streams.build): made in
a part's pattern of sizes or by name, freed newest first or when no longer named, each recorded as it happens."""

from __future__ import annotations

import itertools

from search.model.moment_parts import Named, NamedTensors
from search.streams.sizes import FORWARD_FREED, FORWARD_HELD, FORWARD_MADE
from store.alloc_stream import KIND_INDEX, StreamBuilder


def _kind(part: str) -> str:
    """The stream's kind for a part or resident name (weights of any model count as parameters)."""
    part = part.removeprefix("resident:")
    if part in KIND_INDEX:
        return part
    weights = part in ("init", "ema") or part.endswith(("parameters", "_model"))  # reference_model, reward_model
    return "parameters" if weights else "other"


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
        kind = _kind(part)
        while missing > 0:
            size = min(pattern[i % len(pattern)], missing)
            held.append((self.out.alloc(size, kind), size, ""))
            missing, total, i = missing - size, total + size, i + 1
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

    def make(self, part: str, named: dict[str, Named], sizes: dict[str, tuple[int, ...]]) -> None:
        """Requests the named tensors the part does not hold yet, in order; a name with a pattern in
        ``sizes`` is a group of tensors of those sizes (made together, freed together)."""
        held = self.held.setdefault(part, [])
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
        for part, target in targets.items():
            keep = by_part.get(part, {})
            self.release(part, keep)
            self.shrink(part, max(0, target - sum(t.size for t in keep.values())))
        for part, target in targets.items():
            keep = by_part.get(part, {})
            wanted = max(0, target - sum(t.size for t in keep.values()))
            if part == "activations" and FORWARD_MADE in sizes and wanted and not self.bytes(part):
                self.run_forward(part, wanted, sizes[FORWARD_MADE], sizes[FORWARD_FREED], sizes.get(FORWARD_HELD, ()))
            else:
                self.grow(part, wanted, sizes.get(part, ()))
            self.make(part, keep, sizes)
