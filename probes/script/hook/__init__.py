"""The folder a script probe puts first on the program's ``PYTHONPATH``: its ``sitecustomize`` is the start-up hook
(:mod:`probes.script.hook.sitecustomize`). Nothing else lives here: every module of this folder is importable by
its bare name in the program's processes.
"""
