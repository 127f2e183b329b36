"""A user's plain DeepSpeed training loop, for ``planner probe ... -- python docs/examples/train.py``.

It builds a transformers model from a local ``config.json`` (random weights: nothing is downloaded), starts a
DeepSpeed engine with its own ``AdamW`` optimizer and trains on random tokens until the probe ends it. The
probe's start-up hook sets the strategy's keys (ZeRO stage, offload, micro-batch, accumulation, precision) in
the config passed to ``deepspeed.initialize``; the batch is read back from the engine, so it follows the plan.

Usage: python train.py --config tiny-llama.json [--seq-len 32] [--steps 1000]
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    """Train until ``--steps`` steps are done (the probe ends the program after its timed steps)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="a model's config.json")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()

    config = AutoConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ds_config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 0},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    engine.train()
    for step in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            ids = torch.randint(0, config.vocab_size, (engine.train_micro_batch_size_per_gpu(), args.seq_len))
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
