"""A Hugging Face ``Trainer`` run with DeepSpeed, as users write it: "auto" values in the DeepSpeed config,
the batch sizes in ``TrainingArguments`` (from the command line), a tiny Llama from a config, an in-memory
dataset of random tokens.

Usage: python trainer_program.py --output-dir DIR [--per-device-train-batch-size B] [--gradient-accumulation-steps K]
"""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

SEQ_LEN = 32
DS_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
    "steps_per_print": 1000,
}


class RandomTokens(Dataset):
    def __init__(self, count: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, SEQ_LEN), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--per-device-train-batch-size", type=int, default=2)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
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
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        deepspeed=DS_CONFIG,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_steps=1000,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(64, config.vocab_size))
    trainer.train()
    print("finished training", flush=True)


if __name__ == "__main__":
    main()
