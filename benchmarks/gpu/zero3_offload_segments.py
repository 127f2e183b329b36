"""Where the H200 ZeRO-3 + CPU offload loop row's reserved memory sits, stream by stream (issue 46; needs a CUDA GPU).

The row ``opt13_z3ckoff_mb8_s1024`` (tests/data/gpu/h200-2026-11-26.json) reserved 12,900 MiB where the built
stream replays 11,272 MiB (benchmarks/results/zero3_offload_loop_gap.md). This runs the same training the row ran
(opt-1.3b from its config on the GPU in bf16, checkpointing, ``deepspeed.initialize`` with the row's ds_config, 8 x
1024 random tokens with labels = inputs, 4 steps) in one process per variant and writes, per variant, the segments
torch's allocator holds at the end (``torch.cuda.memory_snapshot()``: no ``empty_cache`` ran, so they are the peak's),
summed by stream, with the peaks. Variants: the row's config (DeepSpeed's 5e8-element reduce bucket, overlap_comm
on: its reduction stream), the same with ``reduce_bucket_size`` = hidden^2 (memplan's probe), and with
``overlap_comm`` off (every reduction on the compute stream: no cross-stream frees). If the 1.6 GiB is on the
reduction stream, the built stream misses an allocation there; if it is on the compute stream and goes away with
``overlap_comm`` off, it is blocks freed to the reduction stream's events (``record_stream``), a timing effect.

Usage (on the device): DS_ACCELERATOR=cuda python3 benchmarks/gpu/zero3_offload_segments.py $OUT/segments.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HF_CONFIG = {
    "model_type": "opt",
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "ffn_dim": 8192,
    "word_embed_proj_dim": 2048,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "do_layer_norm_before": True,
    "activation_function": "relu",
    "dropout": 0.1,
    "tie_word_embeddings": True,
}
ZERO: dict[str, dict[str, Any]] = {
    "row": {},
    "bucket_hidden2": {"reduce_bucket_size": 2048 * 2048},
    "no_overlap": {"overlap_comm": False},
}
MICRO_BATCH, SEQ_LEN, STEPS = 8, 1024, 4


def _ds_config(extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "train_batch_size": MICRO_BATCH,
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-05, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}, **extra},
    }


def _run(variant: str) -> dict[str, Any]:
    """One variant in this process: train, then the allocator's segments by stream."""
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**HF_CONFIG)
    config.use_cache = False
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=list(model.parameters()), config=_ds_config(ZERO[variant])
    )
    after_init = torch.cuda.memory_reserved()
    for _ in range(STEPS):
        ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, SEQ_LEN), device="cuda")
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    torch.cuda.synchronize()
    by_stream: dict[str, list[int]] = defaultdict(list)
    for segment in torch.cuda.memory_snapshot():
        by_stream[str(segment["stream"])].append(int(segment["total_size"]))
    return {
        "variant": variant,
        "ds_config": _ds_config(ZERO[variant]),
        "after_init_reserved": after_init,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "segments_by_stream": {stream: sorted(sizes, reverse=True) for stream, sizes in by_stream.items()},
        "reserved_by_stream": {stream: sum(sizes) for stream, sizes in by_stream.items()},
        "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__},
    }


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_run(sys.argv[2])))
        return 0
    out = Path(sys.argv[1])
    results = []
    for port, variant in enumerate(ZERO):
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + port), DS_ACCELERATOR="cuda")
        done = subprocess.run(
            [sys.executable, __file__, "--child", variant], env=env, capture_output=True, text=True, timeout=300
        )
        lines = done.stdout.strip().splitlines()
        result = (
            json.loads(lines[-1])
            if done.returncode == 0 and lines
            else {"variant": variant, "error": done.stderr[-2000:]}
        )
        results.append(result)
        print(variant, {k: v for k, v in result.items() if k in ("peak_reserved", "reserved_by_stream", "error")})
        out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
