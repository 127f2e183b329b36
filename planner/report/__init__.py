"""What the planner returns and shows, read from a plan's document and never computed again here: the result
records (``results``, the face of ``versioned``, ``plan_results`` and ``probe_results``), a prediction's typed
blocks (``prediction``), the text rendering of every result (``text``, the face of ``prediction_text``,
``probe_text`` and ``text_units``; ``calibration_text``, ``spread_text``) and the memory plot (``plot``).

Imports ``planner.job`` and ``planner.files``.
"""
