"""The packages a plan needs beyond the framework's own install, by what the framework runs the plan with.

One rule today: transformers' ``Trainer`` runs a plan's chunked loss (``loss="chunked"``) through Liger-Kernel,
which its export turns on (``TrainingArguments(use_liger_kernel=True)``, :func:`launch.frameworks.hf.training_kwargs`).
transformers 5.23 applies it in ``Trainer.train`` (``transformers/trainer.py``: ``if self.args.use_liger_kernel:
apply_liger_kernel(...)``), and ``apply_liger_kernel`` (``transformers/integrations/liger.py``) raises
``ImportError("You have set `use_liger_kernel` to `True` but liger-kernel >= 0.3.0 is not available. Please install
it with `pip install liger-kernel`")`` unless ``is_liger_kernel_available()`` (``transformers/utils/import_utils.py``:
the ``liger_kernel`` package at 0.3.0 or later). transformers does not depend on it, so a plain install lacks it.
TRL's trainers compute their loss with their own fused head and never take the chunked loss
(``search.choose.single_space``); memplan's own loop and an accelerate loop run memplan's
``planner.runtime.chunked_causal_lm_loss``, which needs nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NeededPackage:
    """A package the plan's step imports that the framework does not install: its pip requirement and why."""

    requirement: str  # what ``pip install`` takes
    why: str

    def note(self) -> str:
        """One line for an export's notes and the plan's report."""
        return f"install {self.requirement} (pip install '{self.requirement}'): {self.why}"


LIGER_KERNEL = NeededPackage(
    "liger-kernel>=0.3.0",
    "the chunked loss runs as TrainingArguments(use_liger_kernel=True), and transformers' Trainer.train raises "
    "ImportError without it (transformers/integrations/liger.py apply_liger_kernel)",
)


def packages_needed(framework: str, loss: str) -> tuple[NeededPackage, ...]:
    """The packages ``framework`` needs to run a single-model plan whose loss is ``loss`` (empty: none beyond its
    own install)."""
    if framework == "hf" and loss == "chunked":
        return (LIGER_KERNEL,)
    return ()


def packages_setting(framework: str, loss: str) -> dict[str, str]:
    """The plan's ``outside_settings`` entry that names what to install (``{"packages": ...}``; empty: nothing)."""
    needed = packages_needed(framework, loss)
    return {"packages": "; ".join(package.note() for package in needed)} if needed else {}
