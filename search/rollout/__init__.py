"""Rollout engines beside the trainer: vLLM's and SGLang's own memory rules, as pure functions."""
