"""Models built from configs with random weights: the probe's model and engine (``build``), a model's spec and
shape read from transformers' own module tree on the meta device (``shape``), its sequences as transformers reads
them there (``sequences``), LoRA adapters (``lora``), QLoRA's quantized base (``quantize``), the chunked causal-LM
loss (``chunked_loss``), token log-probabilities (``logprobs``) and generation settings (``generation``).

Imports ``probes.measure``, ``probes.process``, ``launch`` and ``store``.
"""
