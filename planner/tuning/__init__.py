"""``planner tune``: the Optuna study over the model's best candidates (``study``), its rounds of probing and
recalibrating (``rounds``) and the entry point (``run``).

Imports ``planner.probing`` and the packages below it.
"""
