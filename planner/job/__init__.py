"""A job resolved: its inputs (``inputs``: JobSpec -> ResolvedJob), the model shapes it reads
(``model_shapes``), the workload cut to a probe's depth (``cut``) and the calibration in force (``calibrated``).

Imports ``planner.files`` and the lower packages.
"""
