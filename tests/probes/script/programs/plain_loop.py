"""A plain DeepSpeed training loop, as users write it: a tiny Llama from a config, random tokens.

Usage: python plain_loop.py [--steps N] [--stage S] [--micro-batch B] [--grad-accum K] [--fixed-batch B]

The micro-batch and the accumulation are read back from the engine (``--fixed-batch`` makes the loop build
batches of its own size instead: a program whose batch contradicts the plan).
"""

import argparse

import deepspeed
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

SEQ_LEN = 32


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--fixed-batch", type=int, default=0)
    args = parser.parse_args()

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": args.stage},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    engine.train()
    for step in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            batch = args.fixed_batch or engine.train_micro_batch_size_per_gpu()
            ids = torch.randint(0, config.vocab_size, (batch, SEQ_LEN))
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    print("finished all steps", flush=True)


if __name__ == "__main__":
    main()
