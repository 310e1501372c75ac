"""The config reference (docs/config.md), generated from the config's JSON Schema."""

from __future__ import annotations

import json
from typing import Any

from dagtrain.config import FILE_ONLY, config_schema

__all__ = ["config_reference"]


def _type(p: dict[str, Any]) -> str:
    if "enum" in p:
        return " \\| ".join(f"`{v}`" for v in p["enum"])
    if "anyOf" in p:
        return " or ".join(_type(x) for x in p["anyOf"])
    t = p.get("type", "any")
    if t == "array":
        return f"list of {_type(p.get('items', {}))}"
    if t == "object":
        return "mapping"
    return t


def _limits(p: dict[str, Any]) -> str:
    bits = []
    for key, sym in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
    ):
        for q in [p, *p.get("anyOf", [])]:
            if key in q:
                bits.append(f"{sym} {q[key]}")
    return ", ".join(bits)


def _mark(field: str) -> str:
    section = field.partition(".")[0]
    return "*file only.* " if field in FILE_ONLY or section in FILE_ONLY else ""


def config_reference() -> str:
    s = config_schema()
    lines = [
        "# Config reference",
        "",
        "Generated from the config's JSON Schema by `dagtrain schema --markdown`; do not "
        "edit by hand.",
        "",
        "A pipeline config is a YAML file of sections. Unknown fields are errors. Relative "
        "paths are relative to the config file. A run's `conf` (trigger form, REST API, "
        "`--set`) may change any field except those marked *file only*.",
        "",
    ]
    top = {k: v for k, v in s["properties"].items() if v.get("type") != "object"}
    lines += ["## top level", "", "| field | type | default | description |", "|---|---|---|---|"]
    for k, p in top.items():
        lines.append(
            f"| `{k}` | {_type(p)} | `{json.dumps(p.get('default'))}` | "
            f"{_mark(k)}{p.get('description', '')} |"
        )
    for section, sub in s["properties"].items():
        if section in top:
            continue
        lines += ["", f"## `{section}`", ""]
        if sub.get("description"):
            lines += [sub["description"], ""]
        lines += ["| field | type | default | limits | description |", "|---|---|---|---|---|"]
        for k, p in sub.get("properties", {}).items():
            default = p.get("default", {} if p.get("type") == "object" else [])
            lines.append(
                f"| `{section}.{k}` | {_type(p)} | `{json.dumps(default)}` | "
                f"{_limits(p)} | {_mark(f'{section}.{k}')}{p.get('description', '')} |"
            )
            nested = next((q for q in [p, *p.get("anyOf", [])] if "properties" in q), None)
            for f, q in (nested or {}).get("properties", {}).items():  # a sub-section's
                lines.append(
                    f"| `{section}.{k}.{f}` | {_type(q)} | `{json.dumps(q.get('default'))}` | "
                    f"{_limits(q)} | {q.get('description', '')} |"
                )
    return "\n".join(lines) + "\n"
