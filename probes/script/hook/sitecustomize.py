"""memplan's start-up hook for a script probe: Python runs it at start-up in every process of the program.

The script probe (:mod:`probes.script.launch`) puts this folder first on the program's ``PYTHONPATH``, so
Python's ``site`` imports this module as ``sitecustomize`` in every Python process the program starts: the
launcher, every rank, data-loader workers, compiler helpers. It does two things, and nothing more unless the
process imports ``deepspeed``:

- it runs the ``sitecustomize`` this one hides (the next one on ``sys.path``, if any), as ``site`` would have,
  under the name ``_memplan_next_sitecustomize``; an error there is printed as ``site`` prints it;
- when ``MEMPLAN_SCRIPT_PROBE`` names a settings file, it puts a finder first on ``sys.meta_path`` that lets
  ``deepspeed`` be found and loaded as usual and, once the package has executed, hands it to
  :func:`probes.script.wrapper.install`, which wraps ``deepspeed.initialize``. Every later
  ``deepspeed.initialize`` and ``from deepspeed import initialize`` sees the wrapper.

memplan's packages are found where memplan is installed, else in the checkout this file lives in (put first
on ``sys.path`` only while they are imported). Any failure of the hook is written as one JSON line to
``hook_errors.jsonl`` beside the settings file (stderr where that cannot be written) and never raised: an
unrelated process goes on as if the hook were not there. Standard library only, imported lazily.
"""

import os
import sys

_VARIABLE = "MEMPLAN_SCRIPT_PROBE"
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))  # hook -> script -> probes -> the checkout
_ERRORS = "hook_errors.jsonl"


def _report(what, text):
    """One line in hook_errors.jsonl beside the settings file; stderr where that fails."""
    import json

    line = json.dumps({"pid": os.getpid(), "what": what, "error": text, "argv": sys.argv[:8]})
    try:
        folder = os.path.dirname(os.path.abspath(os.environ[_VARIABLE]))
        with open(os.path.join(folder, _ERRORS), "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except Exception:  # noqa: BLE001 - nowhere else to say it
        import contextlib

        with contextlib.suppress(Exception):
            sys.stderr.write(f"memplan script probe hook: {what}: {text}\n")


def _chain():
    """Run the next sitecustomize on sys.path, the one this module hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.realpath(_HERE)
    rest = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_memplan_next_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - as site.execsitecustomize reports it
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


class _Loader:
    """The real loader of ``deepspeed``; after the package has executed, ``after(module)`` runs."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader  # the package sees its own loader (resources, reloads)
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._after(module)


class _DeepSpeedFinder:
    """First on sys.meta_path: finds ``deepspeed`` through the other finders and wraps its loader."""

    def __init__(self, settings_path):
        self.settings_path = settings_path
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "deepspeed" or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader, self.loaded)
            return spec
        except Exception:  # noqa: BLE001 - deepspeed is then found as if the hook were not there
            import traceback

            _report("finding deepspeed", traceback.format_exc())
            return None
        finally:
            self.busy = False

    def loaded(self, module):
        try:
            sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
            _import_memplan().install(module, self.settings_path)
        except Exception:  # noqa: BLE001 - the program runs on unprobed; the parent reads the report
            import traceback

            _report("wrapping deepspeed.initialize", traceback.format_exc())


def _import_memplan():
    """``probes.script.wrapper`` with every module it uses loaded, from an installed memplan or, failing that,
    this checkout (first on sys.path only while they are imported)."""
    import importlib

    before = set(sys.modules)
    try:
        wrapper = importlib.import_module("probes.script.wrapper")
        wrapper.preload()
        return wrapper
    except ImportError:
        for name in set(sys.modules) - before:
            del sys.modules[name]  # the half import of the failed attempt
    sys.path.insert(0, _ROOT)
    try:
        wrapper = importlib.import_module("probes.script.wrapper")
        wrapper.preload()
        return wrapper
    finally:
        if _ROOT in sys.path:
            sys.path.remove(_ROOT)


def _main():
    try:
        _chain()
    except Exception:  # noqa: BLE001
        import traceback

        if os.environ.get(_VARIABLE):
            _report("running the next sitecustomize", traceback.format_exc())
    settings = os.environ.get(_VARIABLE)
    if not settings:
        return
    try:
        if "deepspeed" in sys.modules:  # imported by the chained sitecustomize already
            _DeepSpeedFinder(settings).loaded(sys.modules["deepspeed"])
        else:
            sys.meta_path.insert(0, _DeepSpeedFinder(settings))
    except Exception:  # noqa: BLE001
        import traceback

        _report("installing the hook", traceback.format_exc())


_main()
