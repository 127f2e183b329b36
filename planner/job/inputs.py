"""Turning what a user typed (CLI flags or API keywords) into a Workload and a Hardware record: the face of
``planner.job``'s input side.

Every check of user input lives in the modules below, so that each bad value gets one clear InputError:

- :mod:`planner.job.spec`: ``JobSpec`` (the job as typed, and the one place its defaults live),
  ``JobKeywords`` (the API's keywords), ``ResolvedJob``;
- :mod:`planner.job.hardware`: the Hardware record (GPU, node, counts, host memory, network);
- :mod:`planner.job.workload`: the Workload record (models, lengths, batch, dtype, attention, RLHF roles).

:func:`resolve` composes them; :func:`job_fields` reads a saved document's job back.
"""

from __future__ import annotations

from typing import Any

from planner.job.hardware import FALLBACK_INTER_NODE_GBPS, resolve_hardware
from planner.job.model_shapes import shapes_saved_on_success
from planner.job.spec import (
    CONFIG_WORKLOAD,
    DEFAULT_BATCH_PER_GPU,
    DEFAULT_GEN_LEN,
    DEFAULT_GPUS,
    DEFAULT_GRPO_SAMPLES,
    DEFAULT_PROMPT_LEN,
    DEFAULT_SEQ_LEN,
    JobKeywords,
    JobSpec,
    ResolvedJob,
)
from planner.job.workload import NO_BF16_GPUS, resolve_workload
from store.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from store.gpus import GENERIC_PREFIX

# the CLI reaches data through this module: the frameworks' names, the job's defaults, the GPUs without bf16
# and the shape cache's guard are its too
__all__ = [
    "CONFIG_WORKLOAD",
    "DEFAULT_BATCH_PER_GPU",
    "DEFAULT_GEN_LEN",
    "DEFAULT_GPUS",
    "DEFAULT_GRPO_SAMPLES",
    "DEFAULT_PROMPT_LEN",
    "DEFAULT_SEQ_LEN",
    "FRAMEWORKS",
    "NO_BF16_GPUS",
    "JobKeywords",
    "JobSpec",
    "ResolvedJob",
    "job_fields",
    "resolve",
    "shapes_saved_on_success",
]


def resolve(spec: JobSpec, db: str | None = None, *, local: bool = False) -> ResolvedJob:
    """Check and resolve every input of ``spec``; raises InputError with one clear line. ``db`` holds the
    shape cache of traced model configs (default: ``$PLANNER_DB`` or the user's data folder), written only once
    every input of the job is checked (of the whole command, under the CLI: ``shapes_saved_on_success``).
    ``local``: the job runs on this machine (a probe), so this machine's host memory is the default."""
    readings: list[str] = []
    hardware = resolve_hardware(spec, readings, local=local)
    with shapes_saved_on_success():
        workload = resolve_workload(spec, hardware, readings, db)
    return ResolvedJob(workload=workload, hardware=hardware, readings=tuple(readings))


def job_fields(workload: dict[str, Any], hardware: dict[str, Any]) -> dict[str, Any]:
    """JobSpec fields (all but the model) from a document's ``workload`` and ``hardware`` blocks, as
    ``Workload.to_dict`` and ``Hardware.to_dict`` write them (a saved plan, a stored probe's request)."""
    w, h = workload, hardware
    fields = {
        "workload": w["kind"],
        "gpu": None if h["gpu"].startswith(GENERIC_PREFIX) else h["gpu"],  # a --gpu-mem-only job
        "gpu_mem": h["gpu_memory_bytes"],
        "gpus": h.get("gpus", 1),
        "nodes": h.get("nodes", 1),
        "cpu_mem": h["cpu_memory_bytes"],
        "node": h.get("node"),
        # saved before the node catalog, a multi-node plan was made with the fallback network
        "inter_node_gbps": h.get("inter_node_gbps", FALLBACK_INTER_NODE_GBPS if h.get("nodes", 1) > 1 else None),
        "nvme_path": h.get("nvme_path"),
        "safety_margin": h.get("safety_margin", 0.05),
        "batch": w["global_batch"],
        "dtype": w["dtype"],
        "attn_impl": w["attn_impl"],
    }
    for name in ("ref_model", "critic_model", "reward_model", "prompt_len", "gen_len", "ppo_epochs", "kl_coef"):
        if w.get(name) is not None:
            fields[name] = w[name]
    if "prompt_len" not in w:
        fields["seq_len"] = w["seq_len"]
    if w.get("samples_per_prompt", 1) != 1:
        fields["samples_per_prompt"] = w["samples_per_prompt"]
    if w.get("framework", DEFAULT_FRAMEWORK) != DEFAULT_FRAMEWORK:
        fields["framework"] = w["framework"]
    return {k: v for k, v in fields.items() if v is not None}
