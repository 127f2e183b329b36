"""Meta-device tracing for the model catalog: a model's activations (``activations``), their variants per
attention kernel and loss (``variants``), generation and scoring (``generation``), and the module tree read into
a model shape (``probes.model.shape``), written for every catalog model by ``catalog`` (``python -m probes.trace.catalog
--write-catalog``).

Reads ``probes.model`` and ``probes.measure``; nothing below imports it.
"""
