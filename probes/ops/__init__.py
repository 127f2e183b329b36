"""DeepSpeed's ops, built once before any probe, in a child of their own: what to build and the build itself
(``prepare``: ``prepare_ops``, ``OpBuildError``) and the child that builds them (``child``).

Imports ``probes.step``, ``probes.model``, ``probes.process``, ``launch`` and ``store``.
"""
