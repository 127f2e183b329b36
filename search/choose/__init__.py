"""Choosing: the strategy spaces and the searches over them (Optuna, branch and bound)."""
