"""The probe child's training step: the child's main (``child``), the phase clock and phase table
(``phases``), the single-model and RLHF steps (``phases_sft``, ``phases_rlhf``) and the warm-up rule (``warmup``).

Imports ``probes.model``, ``probes.measure``, ``probes.process``, ``launch`` and ``store``.
"""
