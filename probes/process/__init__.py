"""Child processes and what they share: a probe's isolated child (``isolation``), its rank group and
worst rank (``rank_group``, ``worst_rank``), process trees and the watch on the parent (``process_tree``,
``parent_watch``, ``watched``), working folders and locks (``workdir``, ``jit_lock``), the ops cache and CUDA
arch list a child builds with (``op_cache``, ``arch_list``), and the artifacts a child leaves (``artifacts``).

The floor of ``probes``: imports only ``store``.
"""
