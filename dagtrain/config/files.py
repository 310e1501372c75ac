"""Config files in, a run's conf and ``--set`` merged in; errors that name the field."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from .pipeline import PipelineConfig
from .schema import BUILTIN_MODELS, FILE_ONLY, NOT_APPLICABLE, ConfigError
from .training import INIT_KINDS

__all__ = [
    "apply_sets",
    "deep_merge",
    "dotted",
    "without_file_only",
    "load_config",
    "merge_conf",
    "parse_sets",
    "unknown_key",
    "validate",
]

# -- errors ------------------------------------------------------------------------------


def unknown_key(loc: tuple[Any, ...]) -> str:
    """What to say of a key the schema does not know, at ``loc`` (a section, or a field
    of one): its name, and the closest known name if one is close."""
    import difflib

    model: Any = PipelineConfig
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        model = getattr(field, "annotation", None)
        # an optional sub-section (``EarlyStoppingConfig | None``): its model
        model = next((m for m in (model, *get_args(model)) if hasattr(m, "model_fields")), model)
    known = sorted(getattr(model, "model_fields", {}))
    name = str(loc[-1])
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" — did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
    if len(loc) == 1:
        return f"unknown section {name!r}{hint}"
    section = ".".join(str(p) for p in loc[:-1])
    return f"{section}.{name}: unknown field {name!r} of {section}{hint}"


def _is_member(part: Any) -> bool:
    """A part of an error's location that names a member of a union type (pydantic's
    ``literal['auto']``, ``list[int]``, ``int``), not a field."""
    return isinstance(part, str) and ("[" in part or part in _TYPES)


_TYPES = {"int", "float", "str", "bool", "none", "list", "dict"}
_SHOULD = "Input should be "


def explain(e: ValidationError, where: str) -> ConfigError:
    """One line a field: what is allowed and what was given (a union's members, each
    an error of pydantic's, said in one line)."""
    lines: list[str] = []
    fields: dict[str, tuple[list[str], Any]] = {}
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"] if not _is_member(x))
        msg = err["msg"].removeprefix("Value error, ")
        # (a sub-section given as a word: say what it should be, not its class's name)
        msg = re.sub(r"a valid dictionary or instance of \w+", "a mapping of its fields", msg)
        if err["type"] == "extra_forbidden":
            lines.append(f"  {unknown_key(tuple(err['loc']))}")
        elif not loc or isinstance(err.get("input"), dict):  # a check across fields:
            lines.append(f"  {msg}")  # its message names them
        else:
            said, _ = fields.setdefault(loc, ([], err.get("input")))
            said.append(msg)
    for loc, (said, given) in fields.items():
        if all(m.startswith(_SHOULD) for m in said):
            told = "should be " + " or ".join(dict.fromkeys(m[len(_SHOULD) :] for m in said))
        else:
            told = "; ".join(dict.fromkeys(said))
        lines.append(f"  {loc}: {told} (got {given!r})")
    return ConfigError(f"{where}: invalid config\n" + "\n".join(lines))


def validate(data: dict[str, Any], where: str = "config", base_dir: str | None = None):
    try:
        cfg = PipelineConfig.model_validate(data)
    except ValidationError as e:
        raise explain(e, where) from e
    cfg.base_dir = base_dir
    return cfg


_loaded: dict[tuple[str, int, int], PipelineConfig] = {}


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML config file (``yaml.safe_load`` only).

    A file is read again only when it changed (Airflow parses DAG files every few
    seconds, in a process that keeps this module loaded)."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None
    if key in _loaded:
        return _loaded[key].model_copy(deep=True)
    cfg = _load_config(p)
    if key is not None:
        _loaded[key] = cfg.model_copy(deep=True)
    return cfg


def _load_config(p: Path) -> PipelineConfig:
    import yaml

    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config ({e.strerror})") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, not a list/value")
    cfg = validate(data, str(p), str(p.resolve().parent))
    return cfg


# -- overrides ---------------------------------------------------------------------------


def dotted(d: Any, prefix: str = "") -> dict[str, Any]:
    """A config (or part of one) as dotted keys: ``{"training.lr": 0.1, ...}``. A
    model's ``args`` stay one value (its factory's keyword arguments), as does an empty
    section."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and k != "args":
            out.update(dotted(v, key))
        else:
            out[key] = v
    return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base``, section by section and field by field; a model's
    ``args`` merge too, unless ``over`` names another model (whose arguments are its
    own: then they replace the file's)."""
    out = copy.deepcopy(base)
    other_model = "name" in over and over["name"] != base.get("name")
    if other_model and "args" in out:  # another model: none of the file's arguments
        out["args"] = {}
    for k, v in over.items():
        if (
            isinstance(v, dict)
            and isinstance(out.get(k), dict)
            and not (k == "args" and other_model)
        ):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _author_only(cfg: PipelineConfig, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dotted field -> the file's value (or ``values``'s: as the Params show it), for
    fields a run's conf may not change."""
    values = cfg.model_dump(mode="json") if values is None else values
    return {f: _get(values, f) for f in FILE_ONLY}


def without_file_only(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a config's sections) less every field only a config file may set: what
    a file's sections may send as a run's conf (``dagtrain trigger --config``)."""
    out = copy.deepcopy(values)
    for dotted in FILE_ONLY:
        *parents, last = dotted.split(".")
        d: Any = out
        for part in parents:
            d = d.get(part) if isinstance(d, dict) else None
        if isinstance(d, dict):
            d.pop(last, None)
    return {k: v for k, v in out.items() if v != {}}


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d


_MISSING = object()


def merge_conf(
    cfg: PipelineConfig, conf: dict[str, Any] | None, where: str = "the run's conf"
) -> PipelineConfig:
    """The config of one run: the file's, with a run's ``conf`` (sections) merged in.

    Refuses (ConfigError naming the field) a conf that changes a field only a config
    file may set, a model factory path that is not the file's own, or a
    ``training.init`` model file that is not the file's own.
    """
    conf = dict(conf or {})
    if not conf:
        return cfg
    for k in conf:
        if k not in PipelineConfig.model_fields:
            raise ConfigError(f"{where}: {unknown_key((k,))}")
    shown = _author_only(cfg, cfg.shown())
    for field, value in _author_only(cfg).items():
        got = _get(conf, field)
        if isinstance(got, dict) and isinstance(value, dict):  # a section: what it changes
            got = deep_merge(value, got)
        if got is not _MISSING and got != value and got != shown[field]:
            said = f"the file says {value!r}" if value is not None else "the file leaves it unset"
            raise ConfigError(
                f"{where}: {field} may be set only in the pipeline's config file, not by a "
                f"run's conf (--set, the trigger form, the REST API): {FILE_ONLY[field]} "
                f"({said}); edit the file to change it"
            )
    values = cfg.model_dump(mode="json")
    for section in NOT_APPLICABLE[cfg.pipeline]:
        if section in conf and deep_merge(values, {section: conf[section]}) != values:
            raise ConfigError(
                f"{where}: {section} does not apply to a {cfg.pipeline} pipeline "
                f"(pipeline: {cfg.pipeline} in the config file): leave it out"
            )
    name = _get(conf, "model.name")
    if name is not _MISSING and name != cfg.model.name and name not in BUILTIN_MODELS:
        raise ConfigError(
            f"{where}: model.name {name!r} names code; a run's conf may choose only a built-in "
            f"({', '.join(BUILTIN_MODELS)}) or the file's own model; put a factory path in "
            "the config file"
        )
    init = _get(conf, "training.init")
    if init is not _MISSING and init != cfg.training.init and init not in INIT_KINDS:
        meant = next((k for k in INIT_KINDS if str(init).lower() == k), None)
        raise ConfigError(
            f"{where}: training.init {init!r} "
            + (
                f"is not a value: did you mean {meant}?"
                if meant
                else "names a file on the workers; a run's conf may "
                f"choose only {' or '.join(INIT_KINDS)} or the file's own "
                f"({cfg.training.init!r}); put a model file's path in the config file"
            )
        )
    merged = deep_merge(cfg.model_dump(mode="json"), conf)
    for field, value in _author_only(cfg).items():  # the file's own, not as a conf gave it
        if value is not _MISSING and _get(conf, field) is not _MISSING:
            _put(merged, field, value)
    return validate(merged, where, cfg.base_dir)


def _put(d: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        d = d[part]
    d[last] = copy.deepcopy(value)


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """``--set training.epochs=3`` items as a conf dict (values parsed as YAML scalars),
    not validated."""
    import yaml

    conf: dict[str, Any] = {}
    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--set {item!r}: use key=value, e.g. training.epochs=3")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        parts = key.split(".")
        d = conf
        for part in parts[:-1]:
            d = d.setdefault(part, {})
            if not isinstance(d, dict):
                raise ConfigError(f"--set {item!r}: {part} is set twice")
        d[parts[-1]] = value
    return conf


def apply_sets(cfg: PipelineConfig, sets: list[str]) -> dict[str, Any]:
    """``--set`` items as a conf dict, validated against ``cfg`` (errors name the field)."""
    conf = parse_sets(sets)
    merge_conf(cfg, conf, "--set")
    return conf
