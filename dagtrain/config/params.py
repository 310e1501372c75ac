"""The config's JSON Schema, and the Airflow ``Params`` of a DAG built from a config."""

from __future__ import annotations

import copy
import functools
from typing import Any

from .pipeline import PipelineConfig
from .schema import BUILTIN_MODELS, FILE_ONLY, NOT_APPLICABLE
from .training import INIT_KINDS

__all__ = ["config_schema", "dag_params", "fixed_sections"]

# -- schema ------------------------------------------------------------------------------


def config_schema() -> dict[str, Any]:
    """JSON Schema of a pipeline config, with references inlined."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema() -> dict[str, Any]:
    schema = PipelineConfig.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return inline({**target, **rest})
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    def untitled(node: Any) -> Any:  # pydantic's titles repeat the names; parsing pays
        if isinstance(node, dict):  # for every key in Airflow's schema checks
            return {k: untitled(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [untitled(v) for v in node]
        return node

    return untitled(inline(schema))


def _lean(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _lean(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_lean(v) for v in node]
    return node


def fixed_sections(cfg: PipelineConfig) -> dict[str, str]:
    """Sections the trigger form does not offer, and why: every field file-only, or
    not used by this kind of pipeline."""
    schema = _schema()["properties"]
    out: dict[str, str] = {}
    for section, sub in schema.items():
        fields = sub.get("properties")
        if fields is None or section in FILE_ONLY:
            out[section] = FILE_ONLY[section]
        elif all(f"{section}.{f}" in FILE_ONLY for f in fields):
            out[section] = "config file only"
        elif section in NOT_APPLICABLE[cfg.pipeline]:
            out[section] = f"not used by a {cfg.pipeline} pipeline"
    return out


def dag_params(cfg: PipelineConfig) -> dict[str, Any]:
    """Airflow ``Params`` for a DAG built from ``cfg``: one object per section, its
    default the file's values, its schema the config's (with each field's description),
    author-only fields pinned.

    A section the form should not offer (``fixed_sections``) is a Param whose schema is
    ``const`` the file's value: Airflow's trigger form renders such a Param as a hidden
    field, and the REST API refuses a conf that changes it, naming it.
    """
    from airflow.sdk import Param

    schema = config_schema()
    values = cfg.shown()  # no credentials of a data.source URL in the DAG's Params
    fixed = fixed_sections(cfg)
    params: dict[str, Any] = {}
    for section, sub in schema["properties"].items():
        description = sub.pop("description", None)
        if section in fixed:
            why = f"{description + ' ' if description else ''}(not editable: {fixed[section]})"
            params[section] = Param(
                values[section], schema={"const": values[section]}, description=why
            )
            continue
        sub.pop("default", None)  # config_schema() returned a copy of its own
        props = sub.get("properties", {})
        if section == "model":
            names = sorted({*BUILTIN_MODELS, cfg.model.name})
            props["name"] = {**props["name"], "enum": names}
        if section == "training" and "init" in props:  # a file: the file's own only
            kinds = list(dict.fromkeys([*INIT_KINDS, cfg.training.init]))
            props["init"] = {**props["init"], "enum": kinds}
        for dotted in FILE_ONLY:  # the file's own: a conf may only repeat it
            head, _, field = dotted.partition(".")
            if head == section:
                props[field] = {
                    **props[field],
                    "const": values[section][field],
                    "description": f"{props[field].get('description', '')} "
                    f"(config file only: {FILE_ONLY[dotted]})".strip(),
                }
        sub["additionalProperties"] = False
        sub.pop("required", None)  # a conf may give part of a section; the rest is the file's
        # defaults are left out of the schema (the Param's value holds them): Airflow
        # deep-copies every Param into every task at parse time. Draft 7 has all we use,
        # and jsonschema checks a schema against draft 7's metaschema several times
        # faster than against 2020-12's (Airflow checks every Param at each parse)
        schema_ = {"$schema": "http://json-schema.org/draft-07/schema#", **_lean(sub)}
        params[section] = Param(values[section], schema=schema_, description=description)
    return params
