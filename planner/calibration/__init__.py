"""Calibration: gathering what was measured (``gather``: probe rows and records files, ``records``: records
files compared with predictions) and fitting the cost model's coefficients to it (``fit``).

Imports ``planner.planning`` (predicting a resolved job) and the packages below it.
"""
