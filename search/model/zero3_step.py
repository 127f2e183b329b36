"""ZeRO-3's optimizer step without offload, sub-group by sub-group, as DeepSpeed 0.19's ``stage3.py`` runs it.

``_create_fp16_sub_groups`` (l. 1210) cuts the trainable partitions, in ``module.parameters()`` order, into
sub-groups of ``sub_group_size`` elements (:func:`sub_groups`). ``step()`` (l. 2910-2927) takes the gradient norm,
then for each sub-group in turn: ``_prepare_fp32_grad_for_sub_group`` (l. 2683) flattens its 16-bit gradient
partitions out of ``grad_partitions_flat_buffer`` (``self.flatten``: a copy) and upcasts that to fp32
(``.to(fp32)``; an fp32 model's flat copy is already its fp32 gradient), the flat copy a temporary freed at once;
``_optimizer_step`` runs Adam, whose ``exp_avg`` and ``exp_avg_sq`` (``fused_adam.py`` l. 155-157: ``zeros_like``
of the fp32 partition) its first step makes and keeps; ``_release_sub_group`` (l. 2731) drops the fp32 gradient
(``.grad = None``) before the next sub-group. The gradient buffer itself (l. 791), made at init, stays for the
whole run. With the optimizer offloaded the step runs on the host; the device sees ``partition_grads``' copies
of each gradient partition instead (:func:`zero3_offload_grads`).
"""

from __future__ import annotations

from collections.abc import Callable

from search.model.moment_parts import FLAT_GRADS, FP32_GRADS, GRAD_NORM, Moment, Named, NamedTensors, moment
from search.model.shapes import linear_shapes, token_embedding_params
from store.records import ModelSpec

FP32 = 4  # bytes of a sub-group's fp32 gradient element
# per sub-group i: its flattened 16-bit gradient and its fp32 gradient (names end with the sub-group's index)
SUB_GROUP_FLAT, SUB_GROUP_FP32 = f"{FLAT_GRADS}_sub_group_", f"{FP32_GRADS}_sub_group_"
# with the optimizer offloaded, per reduced parameter: the device copy of its gradient partition, its fp32 copy
DEVICE_PARTITION, PARTITION_FP32 = "grad_partition_device_", "grad_partition_fp32_"
FP64 = 8  # bytes of a norm's upcast element (get_norm_dtype(): torch.float64)


def module_parameters(
    model: ModelSpec, lora_rank: int = 0, lm_head: bool = True, stored: Callable[[int], int] | None = None
) -> tuple[tuple[int, bool], ...]:
    """(elements, trainable) of each parameter of the built model, in ``module.parameters()`` order: the token
    embedding, the rest of the embeddings (learned positions, projections), each decoder layer (its two norms
    and its linears, a LoRA adapter's A and B after each linear, then the layer's other parameters, its biases,
    as one), the final norm, and the untied LM head (a critic's one-output value head in its place). Every
    parameter is trainable, or under LoRA only the adapters. The base parameters sum to the model's
    (``ModelSpec.total_params``; the backbone and the value head without the LM head). A layer the shapes do
    not describe (fewer parameters than its linears: routed experts are counted apart) is its count as the
    linears' proportions. ``stored`` maps a block linear's weight count to the elements its tensor holds (ZeRO-3
    QLoRA's packed codes, :func:`search.model.quantized.quantized_weight_elements`); the count is still made."""
    h = model.hidden_size
    token = token_embedding_params(model)
    out: list[tuple[int, bool]] = [(token, not lora_rank)]
    if model.embedding_params > token:
        out.append((model.embedding_params - token, not lora_rank))
    linears = linear_shapes(model)
    groups = (linears[:4], linears[4:])  # attention, then the MLP, each after its norm
    base = 2 * h + sum(n_in * n_out for n_in, n_out in linears)
    counts = model.layer_param_counts or (model.layer_params,) * model.num_layers
    for count in counts:
        scale = min(1.0, count / base)
        made = 0
        for group in groups:
            norm = max(1, int(h * scale))
            out.append((norm, not lora_rank))
            made += norm
            for n_in, n_out in group:
                weight = max(1, int(n_in * n_out * scale))
                out.append((weight if stored is None else stored(weight), not lora_rank))
                made += weight
                if lora_rank:
                    out += [(n_in * lora_rank, True), (lora_rank * n_out, True)]
        if count > made:
            out.append((count - made, not lora_rank))
    final = model.total_params - model.embedding_params - sum(counts) - model.lm_head_params
    if final > 0:
        out.append((final, not lora_rank))
    if not lm_head:
        out.append((h, not lora_rank))
    elif model.lm_head_params:
        out.append((model.lm_head_params, not lora_rank))
    return tuple(out)


def sub_groups(partitions: list[int], sub_group_size: int) -> list[int]:
    """Elements of each optimizer sub-group (stage3.py ``_create_fp16_sub_groups``): the whole group when it
    holds at most ``sub_group_size`` elements, else parameters in order until a sub-group reaches it."""
    total = sum(partitions)
    if sub_group_size >= total:
        return [total] if total else []
    groups, current = [], 0
    for i, numel in enumerate(partitions):
        current += numel
        if current >= sub_group_size or i == len(partitions) - 1:
            groups.append(current)
            current = 0
    return groups


def zero3_sub_groups(model: ModelSpec, lm_head: bool, lora_rank: int, world_size: int, step_elements: int) -> list[int]:
    """Elements of each optimizer sub-group of one rank, in step order: the trainable parameters' partitions
    (``ceil(numel / world size)`` each) cut at ``step_elements``, the sub-group size the states were laid out
    with (:func:`search.model.states.model_states`: the smaller of it and the partition); one sub-group where
    ``step_elements`` covers the partition."""
    params = module_parameters(model, lora_rank, lm_head)
    partitions = [-(-numel // world_size) for numel, trainable in params if trainable]
    total = sum(partitions)
    if step_elements >= sum(numel for numel, trainable in params if trainable) // world_size:
        return [total] if total else []
    return sub_groups(partitions, step_elements)


def zero3_step(kept: int, norm: int, d: int, groups: list[int]) -> tuple[list[Moment], list[NamedTensors]]:
    """The moments of ZeRO-3's optimizer step without offload beside the gradient buffer (``kept``): the
    largest fp64 norm upcast (``norm``, ``get_grad_norm_direct``), then per sub-group of ``groups`` elements
    its flat ``d``-byte gradient copy, its fp32 upcast beside it, the fp32 one alone (Adam steps on it:
    :func:`adam_steps`), each named; the next sub-group's flat copy comes once the fp32 one is dropped."""
    moments = [moment(gradients=kept), moment(gradients=kept + norm)]
    named: list[NamedTensors] = [(), (Named("gradients", GRAD_NORM, norm),)]
    for i, elements in enumerate(groups):
        fp32 = Named("gradients", f"{SUB_GROUP_FP32}{i}", FP32 * elements)
        flat = Named("gradients", f"{SUB_GROUP_FLAT}{i}", d * elements)
        sequence: list[NamedTensors] = [(fp32,)] if d == FP32 else [(flat,), (flat, fp32), (fp32,)]
        for tensors in sequence:
            moments.append(moment(gradients=kept + sum(t.size for t in tensors)))
            named.append(tensors)
    return moments, named


def adam_steps(named: NamedTensors) -> tuple[int, ...]:
    """The bytes of each sub-group's fp32 gradient Adam steps on at a moment holding ``named``: the fp32
    gradient of a sub-group held without its flat copy (:func:`zero3_step`). At an engine's first step Adam
    makes ``exp_avg`` and ``exp_avg_sq`` of that size there (``torch.zeros_like`` of the fp32 partition)."""
    names = {t.name for t in named}
    return tuple(
        t.size
        for t in named
        if t.name.startswith(SUB_GROUP_FP32) and SUB_GROUP_FLAT + t.name.removeprefix(SUB_GROUP_FP32) not in names
    )


def zero3_offload_grads(
    model: ModelSpec, lm_head: bool, lora_rank: int, world_size: int, d: int, chunk_elements: int, stream: int
) -> list[NamedTensors]:
    """ZeRO-3 with the optimizer offloaded: the tensors ``partition_grads`` (stage3.py l. 2006-2053) holds on
    ``stream`` (its reduce-and-partition stream), per moment, as each reduced gradient partition of ``P``
    elements comes. ``grad_buffer.to(device)`` (l. 2024-2028) makes a device copy (``d x P`` bytes) of the host
    buffer it was just copied into; ``_offload_grad_partition_at_boundary`` (l. 1443-1457) upcasts it to fp64 for
    its norm in chunks of at most ``chunk_elements`` (``_constant_buffered_norm2``, one chunk at a time), then
    makes its fp32 copy (``4 x P``) for the host's fp32 gradient, freed once copied; the device copy goes when
    the next parameter's ``grad_buffer`` is bound. Parameters come in the backward's order (the reverse of
    ``module.parameters()``: an untied LM head first, the token embedding last); only those larger than every
    one before need blocks of their own, so only those are made."""
    params = module_parameters(model, lora_rank, lm_head)
    out: list[NamedTensors] = []
    seen = 0
    for numel in (-(-numel // world_size) for numel, trainable in reversed(params) if trainable):
        if numel <= seen:
            continue
        seen, i = numel, len(out) // 3
        device = Named("gradients", f"{DEVICE_PARTITION}{i}", d * numel, stream)
        norm = Named("gradients", f"{GRAD_NORM}_{i}", FP64 * min(numel, chunk_elements), stream)
        fp32 = Named("gradients", f"{PARTITION_FP32}{i}", FP32 * numel, stream)
        out += [(device,), (device, norm), (device, fp32)]
    return out
