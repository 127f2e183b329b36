"""RLHF workloads (ppo, remax, grpo): actor, critic, reference and reward models in one step."""
