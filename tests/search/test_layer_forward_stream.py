"""A decoder layer's forward temporaries in the built stream (issue 46): made and freed where the layer's code
makes and frees them, between its saved tensors.

OPT's decoder layer (transformers' ``modeling_opt.py``, no KV cache, 16-bit, dropout on) makes five b x s x h
tensors it frees within the layer: the ``q_proj`` output before ``* self.scaling``, ``out_proj``'s output
before its dropout, that dropout's output once the residual add has read it, ``fc2``'s output before its
dropout and that dropout's output; and one b x s x ffn tensor: ``fc1``'s output, freed once the ReLU (which
saves its own output) has run. Around the layers, ``OPTDecoder.forward`` holds ``inputs_embeds`` and ``pos_embeds``
(b x s x h each) from before the first layer until it returns. The H200's allocator history of opt-1.3b at
8 x 1024 shows them all: 122 x 32 MiB (5 a layer and the two embedding outputs) and 24 x 128 MiB a step
(``benchmarks/results/cuda_history_gap.md``).
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.model.activations import layer_saved_tensors
from search.single.predict import single_step
from search.step.replayed import stream_of
from search.streams.parts import Parts
from search.streams.sizes import FORWARD_FREED, FORWARD_HELD, FORWARD_MADE, layer_forward_program
from store.alloc_stream import ALLOC, FREE, KIND_INDEX, PHASE, StreamBuilder
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

COEF = Coefficients()
MiB = 2**20


def _forward_allocations(zero_stage: int, checkpointing: bool = False) -> tuple[list[int], list[int]]:
    """(sizes of the activations freed within the first forward, sizes of those it keeps) of opt-1.3b at
    8 x 1024 on an H200."""
    spec = get_gpu("H200")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)
    workload = Workload(kind="sft", model=get_model("opt-1.3b"), seq_len=1024, global_batch=8)
    strategy = Strategy(zero_stage=zero_stage, micro_batch=8, gradient_checkpointing=checkpointing)
    stream = stream_of(single_step(workload, strategy, hardware, COEF), "never")
    made: dict[int, int] = {}
    freed: list[int] = []
    phase, forwards = "", 0
    for op, key, size, _, kind in stream:
        if op == PHASE:
            phase = stream.phases[key]
            forwards += phase == "forward"
            if forwards > 1 or phase == "backward":
                break
        elif op == ALLOC and phase == "forward" and kind == KIND_INDEX["activations"]:
            made[key] = size
        elif op == FREE and key in made:
            freed.append(made.pop(key))
    return freed, list(made.values())


def test_opt_layer_forward_frees_its_temporaries_within_the_forward() -> None:
    layers = get_model("opt-1.3b").num_layers
    freed, kept = _forward_allocations(zero_stage=0, checkpointing=False)
    assert freed.count(32 * MiB) == 5 * layers + 2  # 8 x 1024 x 2048 in bf16; the token and position embeddings
    assert freed.count(128 * MiB) == layers  # 8 x 1024 x 8192 in bf16: fc1's output
    held = dict(layer_forward_program(get_model("opt-1.3b"), 8, 1024, "bf16", "sdpa", COEF))[FORWARD_HELD]
    assert freed[-len(held) :] == list(held)  # freed last: the decoder returns after its last layer
    assert len(freed) == 6 * layers + len(held)
    layer = layer_saved_tensors(get_model("opt-1.3b"), 8, 1024, "bf16", "sdpa", COEF)
    assert kept[: len(layer)] == list(layer)  # the saved tensors as before, in their order


def test_a_layer_program_frees_each_temporary_after_the_tensor_it_names() -> None:
    """Parts.run_forward: three layers of (saved 4, temporary 2 freed after the third tensor, saved 3);
    the bytes left are the saved ones, and the last, cut layer makes no temporary."""
    out = StreamBuilder()
    parts = Parts(out)
    program = {FORWARD_MADE: (4, 2, 3), FORWARD_FREED: (0, 3, 0)}
    parts.move({"activations": 2 * 7 + 4}, program)
    events = [(op, size) for op, _, size, _, _ in out.build().events]
    layer = [(ALLOC, 4), (ALLOC, 2), (ALLOC, 3), (FREE, 0)]
    assert events == layer + layer + [(ALLOC, 4)]
    assert parts.bytes("activations") == 18


def test_what_the_decoder_holds_over_its_layers_is_made_first_and_freed_after_them() -> None:
    """Parts.run_forward with ``over``: the decoder's own tensors (OPT's token and position embedding outputs)
    exist before the first layer's tensors and go once the last layer's are made, before what is left."""
    out = StreamBuilder()
    parts = Parts(out)
    program = {FORWARD_MADE: (4, 2, 3), FORWARD_FREED: (0, 3, 0), FORWARD_HELD: (5, 6)}
    parts.move({"activations": 2 * 7}, program)
    events = [(op, size) for op, _, size, _, _ in out.build().events]
    layer = [(ALLOC, 4), (ALLOC, 2), (ALLOC, 3), (FREE, 0)]
    assert events == [(ALLOC, 5), (ALLOC, 6), *layer, *layer, (FREE, 0), (FREE, 0)]
    assert parts.bytes("activations") == 14  # the held tensors are not the part's saved bytes


def test_opt_program_holds_both_embedding_outputs_over_the_layers() -> None:
    program = dict(layer_forward_program(get_model("opt-1.3b"), 8, 1024, "bf16", "sdpa", COEF))
    held = program[FORWARD_HELD]
    assert sorted(held)[-2:] == [32 * MiB, 32 * MiB]  # inputs_embeds, pos_embeds: 8 x 1024 x 2048 in bf16
    assert all(size < MiB for size in sorted(held)[:-2])  # the position ids and their mask


def test_program_keeps_the_saved_tensors_of_the_cost_model() -> None:
    model = get_model("opt-1.3b")
    program = dict(layer_forward_program(model, 8, 1024, "bf16", "sdpa", COEF))
    kept = tuple(s for s, f in zip(program[FORWARD_MADE], program[FORWARD_FREED], strict=True) if f == 0)
    assert kept == layer_saved_tensors(model, 8, 1024, "bf16", "sdpa", COEF)
