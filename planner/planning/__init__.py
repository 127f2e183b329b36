"""Plans: recommend, predict and check on a job (``predicting``, with ``checking``, ``fallback_search``, ``fixed``
and ``job_call``), every figure a plan's report shows, computed once with the plan's coefficients (``figures``),
what would fit when nothing does (``suggest``), plans and probes kept in the database (``saved``), their export as
files (``exporting``, which reads the plan), the settings outside the DeepSpeed config (``outside``), a program's
measured spread (``program_spread``) and the allocation streams and snapshots kept with probes (``snapshots``).

Imports ``planner.report``, ``planner.job`` and ``planner.files``.
"""
