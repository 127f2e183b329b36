"""Probes from the planner: what to probe (``plan``), one probe session shared by ``planner probe`` and
``planner tune`` (``session``), the device and limits a probe runs with (``device``, ``limits``), how long the
probes about to run will take (``estimate``) and the report of measured against predicted (``report``).

Imports ``planner.calibration`` and the packages below it; ``probes`` is imported where a probe runs (lazily:
it loads torch).
"""
