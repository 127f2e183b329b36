"""Meta-device tracing for the model catalog: a model's activations (``activations``), their variants per
attention kernel and loss (``variants``), generation and scoring (``generation``), every traced term of a config
(``terms``), a hybrid model's linear-attention layers (``hybrid``, with its two-layer cut in ``hybrid_cut``), and
the module tree read into a model shape (``probes.model.shape``), written for every catalog model by ``catalog``
(``python -m probes.trace.catalog --write-catalog``; the terms without dropout modules by ``no_dropout``).

``zero3_host`` counts a real ZeRO-3 engine's hooks per module and pass on the CPU, and ``zero3_host_rates``
fits them over depth (``python -m probes.trace.zero3_host --write``, into ``store/zero3_host_counts.json``).

Reads ``probes.model`` and ``probes.measure``; nothing below imports it.
"""
