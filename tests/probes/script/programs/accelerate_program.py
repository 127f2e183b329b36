"""An Accelerate training loop with a DeepSpeed plugin, as users write it: a tiny Llama from a config, its own
torch optimizer, a DataLoader of random tokens, ``accelerator.accumulate`` and ``accelerator.backward``.

Usage: python accelerate_program.py [--batch-size B] [--gradient-accumulation-steps K] [--zero-stage S]
"""

import argparse

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, LlamaConfig

SEQ_LEN = 32


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--zero-stage", type=int, default=2)
    args = parser.parse_args()

    plugin = DeepSpeedPlugin(zero_stage=args.zero_stage, gradient_accumulation_steps=args.gradient_accumulation_steps)
    accelerator = Accelerator(deepspeed_plugin=plugin)
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (64, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    loader = DataLoader([{"input_ids": row, "labels": row} for row in tokens], batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for epoch in range(1000):
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        accelerator.print(f"epoch {epoch} loss {loss.item():.4f}")
    accelerator.print("finished training")


if __name__ == "__main__":
    main()
