"""Models built from configs with random weights: the probe's model and engine (``build``), the model
spec of a transformers config (``config``), LoRA adapters (``lora``), the chunked causal-LM loss
(``chunked_loss``), token log-probabilities (``logprobs``) and generation settings (``generation``).

Imports ``probes.measure``, ``probes.process``, ``launch`` and ``store``.
"""
