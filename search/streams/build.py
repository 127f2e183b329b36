"""A step's allocation stream, built from the cost model's bytes: what torch's caching allocator is asked for.

The cost model describes a step as resident bytes and phases of moments (:mod:`search.streams.phases`): at each
moment, the bytes each live part holds. The stream makes those moments happen in order, tensor by tensor:

1. **Engine init**, engine by engine (:mod:`search.streams.init`): the weights are loaded tensor by tensor;
   DeepSpeed makes its own copies (ZeRO-1/2's flat buffer, the fp32 master through a 16-bit clone, a zero
   fp32 gradient) and frees the originals and the temporaries, so their blocks stay cached, as on the
   device; ZeRO-1/2 empty the cache before their flat buffer (what earlier engines left cached is released).
   Adam's states are made at each engine's first optimizer step.
2. **Each phase run**, moment by moment in step order: a part whose bytes fall frees its newest tensors
   first (last made, first freed, as a backward releases the top layer's activations first); a part whose
   bytes rise requests its pattern of sizes (:mod:`search.streams.sizes`). All frees of a moment come before
   its requests. A generate call grows HF's KV cache token by token: every layer's K and V are made one
   token longer (``torch.cat``: the new tensor is requested, then the old one freed).
3. **Between phase runs** a phase's transient bytes are freed; what stays is what its group keeps (the
   activations a forward leaves for its backward; the gradients carried between micro-steps).
4. ``empty_cache`` calls where the policy puts them (:func:`store.phases.empties_after`), and before a
   ``fresh`` phase whatever the policy (a colocated rollout engine's turn).

Several steps are built (``steps``): a probe measures after a warm-up step, and reserved memory may still
grow in the second. Bytes outside torch's allocator (the hybrid engine's workspace, and its KV cache) are
not in the stream.
"""

from __future__ import annotations

from collections.abc import Iterable

from search.model.moment_parts import NamedTensors
from search.model.zero3_step import adam_steps
from search.streams.init import EngineInit, Zero3Init
from search.streams.parts import Parts
from search.streams.phases import LIVE_PARTS, OPTIMIZER, OUTSIDE_TORCH_PARTS, Live, StepPhase
from search.streams.workspaces import BACKWARD_WORKSPACE, place_workspaces
from store.alloc_stream import AllocStream, StreamBuilder
from store.phases import END_STEP, empties_after

# step_stream's policy for the stream every policy's is made from: each place a policy may call empty_cache holds a
# marked call (its key names the place), DeepSpeed's own calls unmarked (key 0); search.step.replayed derives each
# policy's stream from it, one build for all of a step's empty_cache variants (issue 42: recommend's latency)
EVERY_PLACE = "every-place"

KV = LIVE_PARTS.index("kv_cache")
OFFLOADED = LIVE_PARTS.index("offloaded_states")
# bytes no torch allocator of the trainer holds: the hybrid engine's, a rollout engine's (the states DeepSpeed
# offloads for a rollout are freed and made again in the stream: _offload_states)
OUTSIDE = tuple(LIVE_PARTS.index(part) for part in OUTSIDE_TORCH_PARTS if part != "offloaded_states")
GRADIENTS = LIVE_PARTS.index("gradients")
# (phase making its first optimizer step, parameter bytes, optimizer-state bytes, its init allocations, the
# sizes of its weights as loaded)
Engines = tuple[tuple[str, int, int, EngineInit, tuple[int, ...]], ...]
STEP_MARK = "step:"  # a marker phase that opens each step (no events of its own)
KV_GROWTH_EVENTS = 64  # most KV growth steps built per generate call (each one exact at its token count)


def outside_torch(moment: Live) -> int:
    """The bytes of a moment that torch's allocator never sees: the hybrid engine's workspace, and a KV cache
    inside it (then the moment's transient bytes, those through torch, leave the cache out); a rollout
    engine's bytes (search.rollout)."""
    kv = moment.parts[KV]
    outside = sum(moment.parts[i] for i in OUTSIDE)
    kv_outside = kv if kv and moment.transient < moment.total - outside else 0
    return outside + kv_outside


def _torch_parts(phase: StepPhase, k: int) -> dict[str, int]:
    """The bytes per part of moment ``k`` that go through torch's allocator."""
    m = phase.moments[k]
    parts = dict(zip(LIVE_PARTS, m.parts, strict=True))
    for part in OUTSIDE_TORCH_PARTS:
        parts.pop(part)
    if outside_torch(m) > sum(m.parts[i] for i in OUTSIDE):
        parts["kv_cache"] = 0
    return parts


def _grow_kv(parts: Parts, target: int, layers: int) -> None:
    """HF's dynamic KV cache from its current bytes to ``target``: each layer's K and V one step longer."""
    start = parts.bytes("kv_cache")
    held = parts.held.setdefault("kv_cache", [])
    if start == 0 or not held:
        parts.grow("kv_cache", target, (target // max(1, 2 * layers),))
        return
    n = len(held)
    steps = min(KV_GROWTH_EVENTS, max(1, (target - start) // (n * 512)))
    for j in range(1, steps + 1):
        per_tensor = (start + (target - start) * j // steps) // n
        grown = []
        for key, _, _ in held:
            grown.append((parts.out.alloc(per_tensor, "kv_cache"), per_tensor, ""))
            parts.out.free(key)
        held[:] = grown
        parts.patterned["kv_cache"] = (per_tensor * n, n)
    parts.shrink("kv_cache", target)
    parts.grow("kv_cache", target, ())


def _run_phase(parts: Parts, phase: StepPhase, rest: dict[str, int], kept: NamedTensors = (), lazy: int = 0) -> None:
    """A phase run, moment by moment, then back to its ``rest`` (keeping the named tensors ``kept``);
    ``lazy`` bytes of Adam's states are made by the first optimizer step of an engine, each exp_avg and
    exp_avg_sq one tensor: ZeRO-3's per sub-group, where Adam steps on its fp32 gradient
    (:func:`search.model.zero3_step.adam_steps`), the rest after the last moment."""
    for k in range(len(phase.moments)):
        sizes = dict(phase.moment_sizes[k] if phase.moment_sizes else phase.sizes)
        targets = _torch_parts(phase, k)
        kv = targets.pop("kv_cache")
        named = phase.moment_named[k] if phase.moment_named else ()
        parts.move(targets, sizes, named)
        if kv > parts.bytes("kv_cache"):
            _grow_kv(parts, kv, phase.kv_layers)
        else:
            parts.shrink("kv_cache", kv)
        for size in adam_steps(named) if lazy else ():
            made = min(2 * size, lazy)
            parts.grow("resident:optimizer_states", parts.bytes("resident:optimizer_states") + made, (size,))
            lazy -= made
    if lazy:
        have = parts.bytes("resident:optimizer_states")
        parts.grow("resident:optimizer_states", have + lazy, (lazy // 2,))
    parts.move(rest, {}, kept)


def _rest(
    phase: StepPhase, keeps: bool, ends: bool, after: StepPhase | None, floor: int = 0
) -> tuple[dict[str, int], NamedTensors]:
    """What a phase run leaves (target bytes per part, and the named tensors kept): everything when the next
    phase of the group continues its work (``keeps``); nothing once the group ``ends``; otherwise the
    gradients carried between micro-steps or, before the optimizer step, those it starts with (ZeRO-0's
    ``param.grad``), among them the named tensors both the run's last moment and the next run's first hold
    (ZeRO-2's gradient partition). The gradients never go below ``floor``, the bytes made at init and kept
    for the whole run (ZeRO-3's ``grad_partitions_flat_buffer``, the oldest of the part: freed last)."""
    if keeps:
        return {}, ()
    targets = {part: 0 for part in LIVE_PARTS if part not in OUTSIDE_TORCH_PARTS}
    targets["gradients"] = floor
    if ends or after is None:
        return targets, ()
    steady = min(m.total - m.transient - sum(m.parts[i] for i in OUTSIDE) for m in phase.moments)
    handed = after.moments[0].parts[GRADIENTS] if after.group == OPTIMIZER else 0
    targets["gradients"] = max(0, steady, handed, floor)
    last = {tensor.name for tensor in phase.moment_named[-1]} if phase.moment_named else set()
    named = after.moment_named[0] if after.moment_named else ()
    return targets, tuple(tensor for tensor in named if tensor.name in last)


def _optimizer_follows(phases: tuple[StepPhase, ...], j: int) -> bool:
    return j < len(phases) and phases[j].group == OPTIMIZER


def _runs(phases: tuple[StepPhase, ...], repeats: dict[str, int]) -> Iterable[tuple[int, bool, bool]]:
    """(phase index, whether the group's next phase continues its work, whether the group ends) in the order
    a step runs them: a group repeated ``n`` times runs its phases in turn ``n`` times (generate calls;
    micro-steps); what its runs carry (accumulated gradients) is released when the group ends."""
    i = 0
    while i < len(phases):
        group = phases[i].group
        j = i
        while j < len(phases) and phases[j].group == group:
            j += 1
        members = list(range(i, j))
        per_run = [phases[p].count // max(1, repeats.get(group, 1)) or 1 for p in members]
        times = max(1, repeats.get(group, 1))
        for n in range(times):
            for p, runs in zip(members, per_run, strict=True):
                for r in range(runs):
                    last = r == runs - 1
                    continues = last and p != members[-1] and phases[p].name == "forward"
                    # accumulated gradients stay for an optimizer step that follows as its own phase
                    ends = n == times - 1 and p == members[-1] and last and not _optimizer_follows(phases, j)
                    yield p, continues, ends
        i = j


def _keep(parts: Parts, part: str, key: int, size: int) -> None:
    """Hand the tensor ``key`` already requested to ``part``'s patterned tensors (freed with them)."""
    parts.held.setdefault(part, []).append((key, size, ""))
    total, count = parts.patterned.get(part, (0, 0))
    parts.patterned[part] = (total + size, count + 1)


def _zero3_init(parts: Parts, z: Zero3Init, gradients: str) -> None:
    """A ZeRO-3 engine's init as DeepSpeed makes it (:class:`search.streams.init.Zero3Init`); the gradient
    partitions' flat buffer goes to the part ``gradients`` (resident, or the step's live gradients)."""
    out = parts.out
    whole = not (z.staged or z.partitioned_at_build)
    originals = [out.alloc(size, "parameters") for size in z.originals] if whole else []
    partitions: list[int] = []
    for i, size in enumerate(z.originals):
        if z.partitioned_at_build:  # zero.Init: each partition made as its module is, no original
            partitions.append(out.alloc(z.partitions[i], "parameters"))
            continue
        key = out.alloc(size, "parameters") if z.staged else originals[i]
        if z.partitions:  # _partition_param: the partition is made, filled, then the original freed
            partitions.append(out.alloc(z.partitions[i], "parameters"))
        out.free(key)
    if z.partitions:  # defragment(): trainable partitions to the host, freed, empty_cache, one flat buffer
        flat = 0
        for key, size, trainable in zip(partitions, z.partitions, z.trainable, strict=True):
            if trainable:
                out.free(key)
                flat += size
            else:
                _keep(parts, "resident:parameters", key, size)
        out.empty_cache()
        if flat:
            _keep(parts, "resident:parameters", out.alloc(flat, "parameters"), flat)
    converted = 0  # _create_fp32_partitions: the last sub-group's fp32 copy lives until the next is made
    for size in z.fp32_sub_groups:
        made = out.alloc(size, "optimizer_states")
        if converted:
            out.free(converted)
        converted = made
        _keep(parts, "resident:optimizer_states", out.alloc(size, "optimizer_states"), size)
    if converted:
        out.free(converted)
    if z.gradient_buffer:  # initialize_optimizer_states: the zero fp32 gradient, dropped at its end
        out.free(out.alloc(z.gradient_buffer, "gradients"))
    if z.bucket:
        _keep(parts, "resident:buffers", out.alloc(z.bucket, "buffers"), z.bucket)
    if z.grad_partitions:
        _keep(parts, gradients, out.alloc(z.grad_partitions, "gradients"), z.grad_partitions)
    for full, host_copy in z.hook_gathers:  # create_reduce_and_remove_grad_hooks: all_gather(), then partition()
        gathered = out.alloc(full, "zero3_gathered")
        if host_copy:  # all_gather_into_tensor's input: the host partition's device copy
            out.free(out.alloc(host_copy, "zero3_gathered"))
        out.free(gathered)


def _engines_init(
    parts: Parts, engines: Engines, resident_sizes: dict[str, tuple[int, ...]], resident: dict[str, int]
) -> None:
    """Each trained engine in turn: its weights loaded, DeepSpeed's own copies made, the originals and the
    temporary copies freed (:mod:`search.streams.init`); Adam's states wait for the first step. ZeRO-3's
    gradient partitions are resident where the step counts them so (``resident["gradients"]``), else the
    step's live gradients, which its first moment then finds made."""
    params = masters = 0
    gradients = "resident:gradients" if resident.get("gradients") else "gradients"
    for _, parameters, optimizer_states, init, loaded in engines:
        if init.zero3 is not None:
            _zero3_init(parts, init.zero3, gradients)
            params += parameters
            masters += optimizer_states - init.lazy - init.at_init
            parts.grow("resident:parameters", params, resident_sizes.get("parameters", ()))
            parts.grow("resident:optimizer_states", masters, resident_sizes.get("optimizer_states", ()))
            continue
        parts.grow("init", init.originals, loaded)
        if init.empties_cache:
            parts.out.empty_cache()
        params += parameters
        parts.grow("resident:parameters", params, resident_sizes.get("parameters", ()))
        parts.shrink("init", 0)
        clone = parts.out.alloc(init.before_master, "optimizer_states") if init.before_master else 0
        masters += optimizer_states - init.lazy - init.at_init
        parts.grow("resident:optimizer_states", masters, resident_sizes.get("optimizer_states", ()))
        if clone:
            parts.out.free(clone)
        zeros = [parts.out.alloc(size, "gradients") for size in init.after_master]
        if init.at_init:  # Adam's states, made by the optimizer step init runs with the zero gradient
            masters += init.at_init
            parts.grow("resident:optimizer_states", masters, (init.at_init // 2,))
        for key in zeros:
            parts.out.free(key)


def _offload_states(parts: Parts, offloaded: int, wanted: int) -> int:
    """DeepSpeed's ``offload_states`` before a rollout engine's turn frees ``wanted`` bytes of the trained
    models' fp32 states (the newest first: Adam's moments, then the masters; then ZeRO-3's gradient
    partition), and ``reload_states`` after it makes them again; returns the bytes now offloaded."""
    if wanted == offloaded:
        return offloaded
    states, grads = parts.bytes("resident:optimizer_states"), parts.bytes("resident:gradients")
    if wanted > offloaded:
        moved = wanted - offloaded
        from_states = min(moved, states)
        parts.shrink("resident:optimizer_states", states - from_states)
        parts.shrink("resident:gradients", max(0, grads - (moved - from_states)))
    else:
        back = offloaded - wanted
        parts.grow("resident:optimizer_states", states + back, ())
    return wanted


def step_stream(
    resident: dict[str, int],
    resident_sizes: dict[str, tuple[int, ...]],
    engines: Engines,
    phases: tuple[StepPhase, ...],
    repeats: dict[str, int],
    empty_cache: str,
    steps: int = 2,
) -> AllocStream:
    """The allocation stream of engine init and ``steps`` steps (see the module docstring)."""
    out = StreamBuilder()
    parts = Parts(out)
    out.phase("setup")
    _engines_init(parts, engines, resident_sizes, resident)
    lazy = {phase: init.lazy for phase, _, _, init, _ in engines if init.lazy}
    states = resident.get("optimizer_states", 0) - sum(lazy.values())
    workspace = resident.get(BACKWARD_WORKSPACE, 0)  # both workspaces placed by search.streams.workspaces
    for name, nbytes in resident.items():  # held apart from the live parts of the same name
        if name == BACKWARD_WORKSPACE:
            continue
        target = states if name == "optimizer_states" else nbytes
        parts.grow(f"resident:{name}", target, resident_sizes.get(name, ()))
    runs = list(_runs(phases, repeats))
    offloaded = 0
    # ZeRO-3's gradient buffer where it is a live part: made at init (_zero3_init), kept across steps
    floor = 0 if resident.get("gradients") else sum(e[3].zero3.grad_partitions for e in engines if e[3].zero3)
    for n in range(steps):
        out.phase(f"{STEP_MARK}{n + 1}")
        for r, (p, continues, ends) in enumerate(runs):
            phase = phases[p]
            after = phases[runs[r + 1][0]] if r + 1 < len(runs) else None
            wanted = max(-m.parts[OFFLOADED] for m in phase.moments)
            if wanted > offloaded:  # freed before the cache is emptied for the engine
                offloaded = _offload_states(parts, offloaded, wanted)
            if phase.fresh:  # the trainer's cache is emptied before a colocated rollout engine wakes
                out.empty_cache()
            out.phase(phase.name)
            offloaded = _offload_states(parts, offloaded, wanted)  # reloaded: the phase's first requests
            _run_phase(parts, phase, *_rest(phase, continues, ends, after, floor), lazy.pop(phase.name, 0))
            _policy_call(out, empty_cache, phase.name, 1 + p)
        _policy_call(out, empty_cache, END_STEP, -1)
    return place_workspaces(out.build(), workspace, STEP_MARK)


def _policy_call(out: StreamBuilder, empty_cache: str, event: str, mark: int) -> None:
    """The policy's ``empty_cache`` call after ``event`` (a phase or ``END_STEP``), where it makes one; under
    :data:`EVERY_PLACE` a call at every such place, marked ``mark`` (1 + the phase's index in the step's phases,
    -1 after the step): :func:`search.step.replayed.policy_stream` keeps a policy's and drops the others."""
    if empty_cache == EVERY_PLACE:
        out.empty_cache(mark)
    elif empties_after(empty_cache, event):
        out.empty_cache()
