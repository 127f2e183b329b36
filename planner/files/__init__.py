"""Writing files safely: one file atomically (``atomic``) and several all-or-nothing (``file_set``).

The floor of ``planner``: imports only ``store``.
"""
