"""``python -m planner``."""

from planner.cli import run

run()
