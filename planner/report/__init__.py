"""What the planner returns and shows: the result records (``results``), a prediction's report
(``prediction``), the text rendering of every result (``text``, ``calibration_text``) and the memory plot
(``plot``).

Imports ``planner.job`` and ``planner.files``.
"""
