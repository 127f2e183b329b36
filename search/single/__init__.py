"""Single-model workloads (sft, reward, dpo): one trained model, and DPO's frozen reference."""
