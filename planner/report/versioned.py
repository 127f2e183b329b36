"""The ``--json`` documents' version: ``schema_version`` on every document and the model configurations the
result records share (``planner.report.results`` is the face).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from store.records import RLHF_WORKLOADS, SINGLE_MODEL_WORKLOADS

# The version of the ``--json`` documents' shape: bumped when a field is removed, renamed or changes meaning
# (adding a field keeps it). The schemas under planner/schema/ are generated from these models.
SCHEMA_VERSION = "1"

# Frozen values; each model builds its validator on first use, so a command pays only for the models it makes.
FROZEN = ConfigDict(frozen=True, defer_build=True)


def _versioned(schema: dict[str, Any]) -> None:
    """A document's JSON Schema: ``schema_version`` is always there (a default in the model, so that documents
    saved before it read back)."""
    schema["required"] = ["schema_version", *(name for name in schema.get("required", []) if name != "schema_version")]


def _one_config_by_workload(schema: dict[str, Any]) -> None:
    """A plan's JSON Schema: ``ds_config`` (single-model workloads) or ``ds_configs`` (RLHF), never both."""
    _versioned(schema)
    for key in ("ds_config", "ds_configs"):  # never null in the document (``_one_config_key``)
        schema["properties"][key].pop("anyOf", None)
        schema["properties"][key].pop("default", None)
    schema["properties"]["ds_config"]["type"] = "object"
    schema["properties"]["ds_configs"].update(type="object", additionalProperties={"type": "object"})
    schema["oneOf"] = [
        {
            "description": "single-model workloads: one DeepSpeed config",
            "required": ["ds_config"],
            "not": {"required": ["ds_configs"]},
            "properties": {"workload": {"properties": {"kind": {"enum": list(SINGLE_MODEL_WORKLOADS)}}}},
        },
        {
            "description": "RLHF workloads: one DeepSpeed config per model (actor, critic, reference, reward)",
            "required": ["ds_configs"],
            "not": {"required": ["ds_config"]},
            "properties": {"workload": {"properties": {"kind": {"enum": list(RLHF_WORKLOADS)}}}},
        },
    ]


DOCUMENT = ConfigDict(frozen=True, defer_build=True, json_schema_extra=_versioned)
PLAN_DOCUMENT = ConfigDict(frozen=True, defer_build=True, json_schema_extra=_one_config_by_workload)


class Versioned(BaseModel):
    """A ``--json`` document: ``schema_version`` first. A document read back (a saved plan) is the current
    version once read: what the current model writes."""

    model_config = DOCUMENT

    schema_version: str = Field(default=SCHEMA_VERSION, json_schema_extra={"const": SCHEMA_VERSION})

    @field_validator("schema_version", mode="before")
    @classmethod
    def _current(cls, value: Any) -> str:
        return SCHEMA_VERSION
