"""``python -m probes.trace.zero3_host [--write]``: count and time what DeepSpeed's ZeRO-3 does per step.

A real ZeRO-3 engine (DeepSpeed's CPU accelerator, gloo, one rank, fp32) trains a tiny OPT of the real model's
module structure (embeddings, decoder layers of q/k/v/out projections, two LayerNorms, fc1/fc2, the final
LayerNorm, the tied head) at 2 and 4 layers, with and without gradient checkpointing and ``offload_optimizer:
cpu``, with memplan's ZeRO-3 buckets for its width. Once the fetch trace is complete (step >= 3) one step is
counted:

- the module hooks of ``parameter_offload.py`` (``pre/post_sub_module_forward/backward_function``), the
  coordinator's ``fetch_sub_module`` / ``release_sub_module`` and ``__all_gather_params`` (with the parameters it
  gathers, ``partitioned_param_coordinator.py``), the optimizer's per-parameter gradient hook
  (``stage3.py reduce_ready_partitions_and_remove_grads``), its bucket reductions and ``partition_grads``;
- the aten ops dispatched in each of those regions, in the optimizer step and in the model's own code (a
  ``TorchDispatchMode``; "compute" ops are those whose overload is not a view).

Then seven steps are timed, each beside the plain model (:class:`PlainModel`), and each region's host seconds per
call become op-equivalents: its seconds over the plain forward's seconds per compute op, the unit the cost model
prices at ``host_s_per_kernel`` (``search.model.zero3_time``). The counts per module, per parameter tensor and per
layer (:func:`probes.trace.zero3_host_rates.rates`) carry them to any depth. ``--write`` stores all of it in
``store/zero3_host_counts.json``; the run takes about half a minute on two cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from probes.process.isolation import free_port, release_shared_memory
from probes.trace.zero3_host_rates import REGIONS, rates, recompute_calls
from store.ds_defaults import zero3_buckets_of

COUNTS_PATH = Path(__file__).resolve().parents[2] / "store" / "zero3_host_counts.json"
WIDTH = {"hidden_size": 32, "ffn_dim": 64, "num_attention_heads": 2, "vocab_size": 64, "max_position_embeddings": 64}
MICRO_BATCH, SEQ_LEN = 2, 16
TIMED_STEPS = 7
WARMUP_STEPS = 3  # the coordinator records its trace in step 1 and runs it from step 2 on (is_complete_trace)


def _environment() -> None:
    """One gloo rank on DeepSpeed's CPU accelerator (as ``probes.process.isolation.child_env`` sets it)."""
    defaults = {
        "DS_ACCELERATOR": "cpu",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())


class Regions:
    """Calls, inclusive host seconds and dispatched aten ops by region; ops go to the innermost region open."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.calls: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.ops: Counter[str] = Counter()
        self.compute_ops: Counter[str] = Counter()
        self.gathered_params = 0
        self.phase = "forward"  # the model's own ops are counted by phase: forward, backward
        self.top_seconds: defaultdict[str, float] = defaultdict(float)  # the outermost regions' seconds, by phase

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        self.stack.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] += elapsed
            self.calls[name] += 1
            self.stack.pop()
            if not self.stack:
                self.top_seconds[self.phase] += elapsed

    def wrap(self, owner: Any, attribute: str, name: str, on_call: Callable[..., None] | None = None) -> None:
        """Replace ``owner.attribute`` (an instance's bound method) by a counted, timed call of it."""
        original = getattr(owner, attribute)

        def counted(*args: Any, **kwargs: Any) -> Any:
            if on_call is not None:
                on_call(*args, **kwargs)
            with self.region(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, counted)

    def op(self, compute: bool) -> None:
        where = self.stack[-1] if self.stack else f"model_{self.phase}"
        self.ops[where] += 1
        if compute:
            self.compute_ops[where] += 1


def _dispatch_counter(regions: Regions) -> Any:
    """A TorchDispatchMode counting every aten op into ``regions``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            regions.op(compute=not getattr(func, "is_view", False))
            return func(*args, **(kwargs or {}))

    return OpCounter()


def tiny_opt(layers: int, checkpointing: bool) -> Any:
    """The tiny OPT in fp32, checkpointed as the probes and the export set it up (``use_reentrant=False``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("opt", num_hidden_layers=layers, dropout=0.0, **WIDTH)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _build_engine(layers: int, checkpointing: bool, offload: bool) -> tuple[Any, Any]:
    import deepspeed

    model = tiny_opt(layers, checkpointing)
    # memplan's ZeRO-3 buckets for this width (store.ds_defaults: a parameter under 10 x hidden elements stays whole,
    # as every 1-D tensor does at a real width and no matrix), but no reuse distance: every module's parameters are
    # released after each use, so each use gathers them (the cost model follows the reuse distance itself)
    buckets = zero3_buckets_of(WIDTH["hidden_size"])
    zero: dict[str, Any] = {
        "stage": 3,
        "reduce_bucket_size": buckets.reduce_bucket_size,
        "stage3_prefetch_bucket_size": buckets.prefetch_bucket_size,
        "stage3_param_persistence_threshold": buckets.param_persistence_threshold,
        "stage3_max_live_parameters": buckets.max_live_parameters,
        "stage3_max_reuse_distance": 0,
    }
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    ds_config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "steps_per_print": 10**9,
    }
    if offload:
        ds_config["zero_force_ds_cpu_optimizer"] = False
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    return engine, model


def _instrument(engine: Any, regions: Regions) -> None:
    offload = engine.optimizer.parameter_offload
    for attribute, name in (
        ("pre_sub_module_forward_function", "pre_forward"),
        ("post_sub_module_forward_function", "post_forward"),
        ("pre_sub_module_backward_function", "pre_backward"),
        ("post_sub_module_backward_function", "post_backward"),
    ):
        regions.wrap(offload, attribute, name)
    coordinator = offload.get_param_coordinator()
    regions.wrap(coordinator, "fetch_sub_module", "fetch")
    regions.wrap(coordinator, "release_sub_module", "release")

    def gathered(params: Any, *args: Any, **kwargs: Any) -> None:
        regions.gathered_params += len(params)

    regions.wrap(coordinator, "_PartitionedParameterCoordinator__all_gather_params", "all_gather", gathered)
    optimizer = engine.optimizer
    regions.wrap(optimizer, "reduce_ready_partitions_and_remove_grads", "grad_hook")
    regions.wrap(optimizer, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", "grad_reduce")
    regions.wrap(optimizer, "partition_grads", "partition_grads")


def _step(engine: Any, regions: Regions, batch: Any) -> dict[str, float]:
    """One training step; returns the wall seconds of its forward and backward (hooks included)."""
    start = time.perf_counter()
    regions.phase = "forward"
    loss = engine(input_ids=batch, labels=batch).loss
    forward = time.perf_counter() - start
    regions.phase = "backward"
    engine.backward(loss)
    backward = time.perf_counter() - start - forward
    with regions.region("step"):
        engine.step()
    return {"forward": forward, "backward": backward}


class PlainModel:
    """The same tiny model in plain torch, without DeepSpeed: the yardstick of the host work. Its forward's seconds
    per dispatched compute op are the model's own host cost per op on this CPU; a hook's seconds over them are its
    cost in op-equivalents, which the cost model prices at the target's ``host_s_per_kernel`` (the forward's host
    time per kernel the calibration fits)."""

    def __init__(self, layers: int, checkpointing: bool) -> None:
        import torch

        self.model = tiny_opt(layers, checkpointing)
        self.batch = torch.randint(3, WIDTH["vocab_size"], (MICRO_BATCH, SEQ_LEN))
        regions = Regions()
        with _dispatch_counter(regions):
            self.model(input_ids=self.batch, labels=self.batch)
        self.forward_ops = regions.compute_ops["model_forward"]  # compute ops of one forward

    def time(self) -> tuple[float, float]:
        """Seconds of one forward and one backward."""
        start = time.perf_counter()
        loss = self.model(input_ids=self.batch, labels=self.batch).loss
        middle = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        self.model.zero_grad(set_to_none=True)
        return middle - start, end - middle


def structure(model: Any) -> dict[str, int]:
    """The units the counts are expressed in: modules (DeepSpeed hooks every one, the root included), modules
    holding parameters of their own, parameter tensors (tied ones once), decoder layers."""
    modules = list(model.modules())
    return {
        "modules": len(modules),
        "modules_with_params": sum(1 for m in modules if any(True for _ in m.parameters(recurse=False))),
        "param_tensors": len(list(model.parameters())),
        "layers": model.config.num_hidden_layers,
    }


def count_case(layers: int, checkpointing: bool, offload: bool, *, timed: bool = True) -> dict[str, Any]:
    """Counts and (``timed``) host seconds of one step of one configuration (see the module docstring)."""
    import torch

    engine, model = _build_engine(layers, checkpointing, offload)
    regions = Regions()
    _instrument(engine, regions)
    batch = torch.randint(3, WIDTH["vocab_size"], (MICRO_BATCH, SEQ_LEN))
    for _ in range(WARMUP_STEPS):
        _step(engine, regions, batch)
    coordinator = engine.optimizer.parameter_offload.get_param_coordinator()
    complete = bool(coordinator.is_complete_trace())
    regions.reset()
    with _dispatch_counter(regions):
        _step(engine, regions, batch)
    counted: dict[str, Any] = {
        "calls": {r: regions.calls[r] for r in REGIONS},
        "gathered_params": regions.gathered_params,
        "ops": {r: regions.ops[r] for r in (*REGIONS, "model_forward", "model_backward")},
        "compute_ops": {r: regions.compute_ops[r] for r in (*REGIONS, "model_forward", "model_backward")},
    }
    case = {
        "layers": layers,
        "gradient_checkpointing": checkpointing,
        "offload_optimizer": "cpu" if offload else "none",
        "trace_complete": complete,
        "structure": structure(model),
        **counted,
    }
    if not timed:
        engine.destroy()
        return case
    forward_calls = counted["calls"]["pre_forward"] - recompute_calls(counted, checkpointing)
    backward_calls = counted["calls"]["pre_backward"] + recompute_calls(counted, checkpointing)
    unit = PlainModel(layers, checkpointing=False)
    plain = unit if not checkpointing else PlainModel(layers, checkpointing=True)
    samples: list[dict[str, float]] = []
    for _ in range(TIMED_STEPS):  # without the dispatch mode; the yardstick timed beside each step
        for _ in range(2):
            unit.time()  # warm again after the engine's step
        unit_forward, _ = unit.time()
        plain_forward, plain_backward = plain.time() if plain is not unit else unit.time()
        per_op = unit_forward / unit.forward_ops
        regions.reset()
        wall = _step(engine, regions, batch)
        sample = {name: regions.seconds[name] / max(regions.calls[name], 1) / per_op for name in REGIONS}
        # what the wrapped model spends outside the counted hooks beyond the plain model's own time: the autograd
        # Functions DeepSpeed applies to every module's inputs and outputs (parameter_offload.py
        # _pre_backward_module_hook / _post_backward_module_hook) and their backward nodes, torch's hooked-module
        # call path, the engine's per-pass work; per module pre-hook call of the pass
        outside_forward = wall["forward"] - regions.top_seconds["forward"] - plain_forward
        outside_backward = wall["backward"] - regions.top_seconds["backward"] - plain_backward
        sample["forward_wrapper"] = max(outside_forward, 0.0) / forward_calls / per_op
        sample["backward_wrapper"] = max(outside_backward, 0.0) / backward_calls / per_op
        sample["s_per_compute_op"] = per_op
        samples.append(sample)
    engine.destroy()
    median = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    return {
        **case,
        "module_calls": {"forward": forward_calls, "backward": backward_calls},
        "yardstick": {"s_per_compute_op": median.pop("s_per_compute_op"), "forward_compute_ops": unit.forward_ops},
        "op_equivalents_per_call": median,
    }


def _start() -> None:
    """One gloo rank on DeepSpeed's CPU accelerator, one thread (the host work is timed single-threaded)."""
    _environment()
    import deepspeed
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")


def run(depths: tuple[int, ...] = (2, 4)) -> dict[str, Any]:
    """Every case at every depth, with the rates the cost model reads."""
    _start()
    import deepspeed
    import torch

    count_case(depths[0], False, False)  # a first engine warms the process (imports, caches): not kept
    cases = [count_case(layers, ckpt, off) for off in (False, True) for ckpt in (False, True) for layers in depths]
    return {
        "source": "python -m probes.trace.zero3_host --write",
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "model": {"family": "opt", **WIDTH, "micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "dtype": "float32"},
        "cases": cases,
        "rates": rates(cases),
    }


USAGE = "usage: python -m probes.trace.zero3_host [--write | --counts-only [--offload] [--checkpointing] DEPTH...]"


def main(argv: list[str] | None = None) -> int:
    """Count, print, and with ``--write`` store everything in ``store/zero3_host_counts.json``; ``--counts-only``
    prints the counts (no timing) of one configuration at the given depths, one JSON line each. The shared-memory
    buffer DeepSpeed's CPU backend made for the engines is removed at the end, however the run ends."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        release_shared_memory(os.environ.get("MASTER_PORT", ""))


def _main(args: list[str]) -> int:
    if args[:1] == ["--counts-only"]:
        flags = {a for a in args[1:] if a.startswith("--")}
        depths = [a for a in args[1:] if not a.startswith("--")]
        if not depths or not all(d.isdigit() for d in depths) or flags - {"--offload", "--checkpointing"}:
            print(USAGE, file=sys.stderr)
            return 2
        _start()
        for depth in depths:
            case = count_case(int(depth), "--checkpointing" in flags, "--offload" in flags, timed=False)
            print(json.dumps(case), flush=True)
        return 0
    if args not in ([], ["--write"]):
        print(USAGE, file=sys.stderr)
        return 2
    result = run()
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if "--write" in args:
        COUNTS_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {COUNTS_PATH}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
