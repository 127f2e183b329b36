"""Plans: recommend, predict and check on a job (``predicting``), what would fit when nothing does
(``suggest``), plans and probes kept in the database (``saved``), their export as files (``exporting``) and the
allocation streams and snapshots kept with probes (``snapshots``).

Imports ``planner.report``, ``planner.job`` and ``planner.files``.
"""
