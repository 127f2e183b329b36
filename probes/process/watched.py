"""``python -m probes.process.watched MODULE ARGS...``: run ``python -m MODULE ARGS...`` in a process that ends with the
planner (:func:`probes.process.parent_watch.watch_parent`).

The rank group's launcher (``torch.distributed.run``, :mod:`probes.process.rank_group`) runs this way: it is not
code of ours, and its ranks, in sessions of their own, watch it as their parent. Pure Python: no torch here.
"""

from __future__ import annotations

import runpy
import sys

from probes.process.parent_watch import watch_parent


def main(argv: list[str]) -> None:
    """Watch the parent, then run ``argv[0]`` as ``__main__`` with ``argv`` as its command line."""
    watch_parent()
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m probes.process.watched MODULE [ARGS...]")
    main(sys.argv[1:])
