"""Probing the user's own training program: their script, their framework, their launcher, under the plan.

Every built-in probe runs memplan's own training step. A script probe runs the user's command (a plain DeepSpeed
loop, a Hugging Face ``Trainer``, TRL, Accelerate, OpenRLHF or DeepSpeed-Chat, under ``python``/``torchrun``/
``deepspeed``/``accelerate launch``) and measures what that program does under one strategy, without touching
its files:

- ``settings``: what the probe asks (:class:`ScriptProbeSettings`: the strategy's DeepSpeed config keys, the
  settings outside the config, warm-up and timed steps) and how those keys enter the program's own config;
- ``hook/``: the start-up hook, a ``sitecustomize`` first on the program's ``PYTHONPATH`` that chains to any other
  and, in every process that imports ``deepspeed``, wraps ``deepspeed.initialize``;
- ``wrapper``: the wrapper, in the program's processes: it applies the strategy at ``initialize``, records what the
  engine really runs with, measures the engine's forward, backward and optimizer step as the built-in probes do
  (:class:`probes.step.phases.PhaseClock`), and ends every rank cleanly after the timed steps;
- ``program_model``: what the wrapper reads of the program's model and engine (LoRA ranks, checkpointing, the
  engine's settings, a forward's batch size) and where the run contradicts the plan;
- ``launch`` and ``watch``: the planner's side: run the command in a process tree that ends with the planner, end it
  on a timeout or an interrupt;
- ``outcome``: what the ranks left, and the outcome decided from it (:data:`probes.script.outcome.OUTCOMES`).

From Python::

    from probes.script import ScriptProbeSettings, run_script_probe

    settings = ScriptProbeSettings.for_strategy(strategy, workload, hardware, device="cuda")
    result = run_script_probe(["torchrun", "--nproc-per-node", "2", "train.py"], settings, timeout_s=900)
    result.outcome, result.ran_with["zero_stage"], result.phases, result.log_tail

Names load on first use: the hook imports :mod:`probes.script.wrapper` in the program without the parent's side.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OUTCOMES", "ScriptProbeResult", "ScriptProbeSettings", "program_fingerprint", "run_script_probe"]


def __getattr__(name: str) -> Any:
    if name in ("OUTCOMES", "ScriptProbeResult"):
        import probes.script.outcome

        return getattr(probes.script.outcome, name)
    if name in ("program_fingerprint", "run_script_probe"):
        import probes.script.launch

        return getattr(probes.script.launch, name)
    if name == "ScriptProbeSettings":
        from probes.script.settings import ScriptProbeSettings

        return ScriptProbeSettings
    raise AttributeError(f"module 'probes.script' has no attribute {name!r}")
