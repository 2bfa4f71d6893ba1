"""Loading, overriding and printing :class:`~flowgrpo.config.Config`.

``load_config(path, overrides)`` reads YAML, applies ``section.key=value`` overrides (values parsed
as YAML), type-checks every value against the dataclass field and runs the validators, so that
an unknown key, a wrong type or a bad value fails before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml

from .config import Config, ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "digits.yaml"

_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list}

# keys that moved, so an old config gets the new spelling instead of a bare "unknown key"
_MOVED = {
    f"sampler.window_{old}": f"train.step_selection: window with train.step_selection_params "
                             f"{{{new}: ...}}"
    for old, new in (("size", "size"), ("stride", "stride"), ("shift_every", "shift_every"),
                     ("strategy", "strategy"), ("start", "start"))
}


def _coerce(key: str, value: Any, type_name: str) -> Any:
    """Check ``value`` against a field type; ints are accepted as floats, '1e-4' as a float."""
    want = _TYPES[type_name]
    if want is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (want is int and isinstance(value, bool)) or not isinstance(value, want):
        raise ConfigError(
            f"{key}: expected {type_name}, got {type(value).__name__} {value!r}"
        )
    return value


def _build(cls: type, data: dict, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    moved = [f"{prefix}{k}" for k in unknown if f"{prefix}{k}" in _MOVED]
    if moved:
        raise ConfigError(f"{moved[0]} has moved: use {_MOVED[moved[0]]}")
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]}{hint}; valid keys: {', '.join(sorted(known))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value or {}, key + ".")
        else:
            kwargs[name] = _coerce(key, value, hint.__name__)
    return cls(**kwargs)


def from_dict(data: dict) -> Config:
    """Build and validate a config from a nested dict."""
    return _build(Config, data or {}, "").validate()


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-4"`` -> ``(["train", "lr"], 1e-4)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override key {key!r} must look like section.key")
    return parts, yaml.safe_load(raw) if raw.strip() else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``section.key[.sub]=value`` overrides to a nested dict (in place; returned)."""
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (default: the CPU digits job), apply overrides, validate."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return from_dict(apply_overrides(data, overrides or []))


def describe_fields() -> str:
    """Every config key with its default and help text (``flowgrpo config --help-fields``)."""
    lines = []
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        lines.append(f"{section.name}:")
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            lines.append(f"  {f.name} = {default!r}  # {f.metadata.get('help', '')}")
    return "\n".join(lines)
