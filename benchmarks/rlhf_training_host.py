"""Host work of an RLHF actor's training step against an SFT step of the same shape, on DeepSpeed's CPU accelerator.

On the H100 records the PPO probes' actor and critic training phases took 0.25-0.33 s, 20-30% more than the time
model's 0.23 s, while the SFT probe of the same opt-1.3b ZeRO-2 step (4 x 512 tokens) is predicted within 3-8%.
This asks whether the host does more work in the RLHF step: the same engine config, checkpointing and loss in a
process that holds four engines and has just run ``generate`` (PPO), or one engine (SFT). Both run in fresh
processes (the probes' own child environment), an OPT of opt-1.3b's depth (24 layers) at a tiny width so every
kernel is negligible and the step is host work only. Per mode it prints the median step time, the time Python's
cyclic garbage collector took inside the steps (``gc.callbacks``), and the ATen operators one step dispatches
(kernels, and metadata-only views and detaches).

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/rlhf_training_host.py [--steps 6]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.workload_kinds import KindTraits  # noqa: E402

# operators that only make a view or a handle (no kernel on a GPU)
METADATA_OPS = {
    "aten.detach", "aten.view", "aten.t", "aten.transpose", "aten._unsafe_view", "aten.expand", "aten.slice",
    "aten.select", "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.as_strided", "aten.alias",
    "aten._reshape_alias", "aten.split", "aten.unbind", "aten.split_with_sizes", "aten.empty", "aten.empty_like",
    "aten.empty_strided", "aten.is_same_size", "aten.lift_fresh", "aten.set_", "aten._local_scalar_dense",
    "aten.reshape", "aten.narrow",
}  # fmt: skip
OPT = dict(
    model_type="opt", hidden_size=64, num_hidden_layers=24, num_attention_heads=4, ffn_dim=256, word_embed_proj_dim=64,
    vocab_size=512, max_position_embeddings=640, dropout=0.1,
)  # fmt: skip
ZERO2 = {
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
    "zero_optimization": {
        "stage": 2, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 2e8,
        "allgather_bucket_size": 2e8, "reduce_scatter": True,
    },
}  # fmt: skip
FROZEN = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}
PROMPT, GENERATED = 32, 256


def _engines(kind: KindTraits) -> tuple[Any, list[Any]]:
    """The actor's engine (ZeRO-2, checkpointed) and the frozen engines of ``kind``, the critic's built beside."""
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**OPT)

    def model(checkpointed: bool) -> Any:
        built = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(torch.bfloat16)
        if checkpointed:
            built.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return built

    torch.manual_seed(0)
    actor_model = model(True)
    actor, *_ = deepspeed.initialize(model=actor_model, config=ZERO2, model_parameters=actor_model.parameters())
    frozen = []
    if kind.trains_critic:  # the critic (trained) beside the actor
        critic_model = model(True)
        deepspeed.initialize(model=critic_model, config=ZERO2, model_parameters=critic_model.parameters())
    if kind.rlhf:  # the reference and reward models (frozen)
        for _ in range(2):
            held = model(False).requires_grad_(False)
            frozen.append(deepspeed.initialize(model=held, config=FROZEN)[0])
    return actor, frozen


def _child(mode: str, steps: int) -> dict[str, Any]:
    """One mode's measurements, in this (fresh) process."""
    import gc
    import statistics
    import time
    from collections import Counter

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from store.workload_kinds import traits

    class Dispatched(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    collected = {"s": 0.0, "start": 0.0}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collected["start"] = time.perf_counter()
        else:
            collected["s"] += time.perf_counter() - collected["start"]

    gc.callbacks.append(on_gc)
    kind = traits(mode)
    actor, frozen = _engines(kind)
    ids = torch.randint(3, OPT["vocab_size"], (2, PROMPT + GENERATED))
    times, gc_s, ops = [], [], Counter[str]()
    for step in range(steps + 1):  # the first is a warm-up
        sequences = ids
        if kind.generates:
            actor.eval()
            with torch.no_grad():
                sequences = actor.module.generate(
                    input_ids=ids[:, :PROMPT], max_new_tokens=GENERATED, min_new_tokens=GENERATED, do_sample=True
                )
                for engine in frozen:
                    engine(input_ids=sequences)
        actor.train()
        before = collected["s"]
        counter = Dispatched()
        start = time.perf_counter()
        with counter if step == steps else contextlib.nullcontext():
            logits = actor(input_ids=sequences, use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, sequences[:, 1:].unsqueeze(-1))
            actor.backward(-logp.mean())
            actor.step()
        if step == steps:
            ops = counter.ops  # counted on an extra step: the dispatch mode's own cost stays out of the times
        elif step:
            times.append(time.perf_counter() - start)
            gc_s.append(collected["s"] - before)
    kernels = sum(n for op, n in ops.items() if op not in METADATA_OPS)
    return {
        "mode": mode,
        "engines": 1 + int(kind.trains_critic) + len(frozen),
        "step_ms": 1e3 * statistics.median(times),
        "step_ms_min": 1e3 * min(times),
        "step_ms_max": 1e3 * max(times),
        "gc_ms": 1e3 * statistics.median(gc_s),
        "kernel_ops": kernels,
        "metadata_ops": sum(ops.values()) - kernels,
        "tracked_objects": len(gc.get_objects()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child", choices=("sft", "ppo"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("MEMPLAN_RESULT " + json.dumps(_child(args.child, args.steps)), flush=True)
        return 0
    from probes.process.isolation import child_env, release_shared_memory

    rows = []
    for mode in ("sft", "ppo"):
        env = child_env("cpu", "default")
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--steps", str(args.steps)],
                env={**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")},
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            release_shared_memory(env["MASTER_PORT"])
        lines = [line for line in done.stdout.splitlines() if line.startswith("MEMPLAN_RESULT ")]
        if done.returncode or not lines:
            print(f"{mode} failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(lines[-1].split(" ", 1)[1]))
    print(f"{os.cpu_count()} cores; an OPT of 24 layers, hidden 64, micro-batch 2 x {PROMPT + GENERATED} tokens, bf16")
    print("| mode | engines | step ms (median, min-max) | gc ms per step | kernel ops | metadata ops | tracked objects")
    print("|---|---|---|---|---|---|---")
    for r in rows:
        print(
            f"| {r['mode']} | {r['engines']} | {r['step_ms']:.1f} ({r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}) "
            f"| {r['gc_ms']:.2f} | {r['kernel_ops']} | {r['metadata_ops']} | {r['tracked_objects']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
