"""Loading, overriding and printing :class:`~flowgrpo.config.schema.Config`.

``load_config(path, overrides)`` reads YAML, applies ``section.key=value`` overrides (values parsed
as YAML), type-checks every value against the dataclass field and runs the validators, so that
an unknown key, a wrong type or a bad value fails before any model is loaded. An override that
switches a piece (``sampler.name=ode``) brings that piece's own defaults: the parameters the file
wrote for the piece it named are dropped, the user's own are kept (:func:`layer`,
:data:`SWITCH_RULE`). YAML is read with
:class:`UniqueKeyLoader` (a repeated key is an error, not a silent override), and a syntax error,
a file that is not UTF-8 or a non-finite float is reported as a :class:`ConfigError` naming the
file and line (or the key).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

from flowgrpo.config.pieces import SLOTS, builtin_names
from flowgrpo.config.schema import Config
from flowgrpo.data.files import SHIPPED, read_utf8
from flowgrpo.errors import ConfigError
from flowgrpo.registry import suggestion
from flowgrpo.validation import is_integer, is_number

DEFAULT_CONFIG = SHIPPED / "digits.yaml"


def resolve_config(path: str | Path) -> Path:
    """Where a config argument points: ``path`` itself when it exists; else, for a relative
    path, the shipped file of that name, with or without a leading ``configs/`` and the
    ``.yaml`` suffix (``configs/sd35_pickscore.yaml``, ``configs/sd35_pickscore``,
    ``sd35_pickscore``), so the recipes work from any folder and from an installed wheel."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts and path.parts[0] == "configs" else path.parts
    for candidate in (SHIPPED.joinpath(*parts), SHIPPED.joinpath(*parts).with_suffix(".yaml")):
        if parts and candidate.is_file():
            return candidate
    return path


def recipes() -> list[tuple[str, str]]:
    """``[(file name, the start of its header comment)]`` of the shipped configs."""
    out = []
    for path in sorted(SHIPPED.glob("*.yaml")):
        header = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("# ").strip())
        first = " ".join(header).split(". ")[0].split("; ")[0].rstrip(".")
        out.append((path.name, textwrap.shorten(first, 72, placeholder=" ...")))
    return out

_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list}

# keys that moved, so an old config gets the new spelling instead of a bare "unknown key"
_MOVED = {
    f"sampler.window_{old}": f"train.step_selection: window with train.step_selection_params "
                             f"{{{new}: ...}}"
    for old, new in (("size", "size"), ("stride", "stride"), ("shift_every", "shift_every"),
                     ("strategy", "strategy"), ("start", "start"))
}


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key written twice in one YAML mapping (``where``: its dotted path; ``first``: the line of
    the first occurrence, 1-based)."""

    def __init__(self, key: Any, where: str, first: int, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"duplicate key {key!r}", mark)
        self.key, self.where, self.first = key, where, first


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping.

    Plain PyYAML keeps the last value silently, so ``lr: 1e-3`` ... ``lr: 1e-5`` in one section
    would train with whichever comes last. Merge keys (``<<: *anchor``) may still override.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self.mapping_paths = _mapping_paths(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node:
                where = getattr(self, "mapping_paths", {}).get(id(node)) or "the top level"
                raise DuplicateKeyError(key, where, first.start_mark.line + 1,
                                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def _mapping_paths(root: yaml.Node) -> dict[int, str]:
    """``id(mapping node) -> its dotted key path`` (``train``, ``reward.components[0]``)."""
    paths: dict[int, str] = {}
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in paths:  # an alias seen before (or a recursive one)
            continue
        paths[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            for key_node, value in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                stack.append((value, f"{path}.{name}" if path else str(name)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((value, f"{path}[{i}]") for i, value in enumerate(node.value))
    return paths


def parse_yaml(text: str, source: str, lines: bool = True) -> Any:
    """Parse YAML ``text`` with :class:`UniqueKeyLoader`; an error becomes a one-line
    :class:`ConfigError` starting with ``source`` (``source:line`` when ``lines``)."""
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # safe: a SafeLoader subclass
    except DuplicateKeyError as err:
        detail = f" in {err.where} (first at line {err.first})" if lines else ""
        where = _where(source, err.problem_mark.line, lines)
        raise ConfigError(f"{where}: {err.problem}{detail}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = _where(source, mark.line if mark else None, lines)
        problem = err.problem or err.context
        if err.problem and err.context and err.context_mark and lines:  # where it started
            problem += f" ({err.context} at line {err.context_mark.line + 1})"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    except yaml.reader.ReaderError as err:  # a control character or a lone surrogate
        where = _where(source, text.count("\n", 0, max(err.position, 0)), lines)
        raise ConfigError(f"{where}: YAML syntax error: unacceptable character "
                          f"#x{err.character:04x} ({err.reason})") from None
    slip = _colon_slip(data)
    if slip:
        key, value = slip.split(":", 1)
        raise ConfigError(f"{source}: YAML read {slip!r} as one key with no value, because a "
                          f"colon needs a space after it: write {{{key}: {value}}}")
    return data


def _colon_slip(data: Any) -> str | None:
    """The first mapping key like ``size:3`` with no value (``{size:3}``: YAML reads a colon
    followed by no space as part of the key), else None."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if (value is None and isinstance(key, str) and ":" in key
                        and not key.startswith(":") and not key.endswith(":")
                        and "://" not in key):
                    return key
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def _where(source: str, line: int | None, lines: bool) -> str:
    """``source:line`` (1-based, from PyYAML's 0-based ``line``), or ``source``."""
    return f"{source}:{line + 1}" if lines and line is not None else source


def _coerce(key: str, value: Any, type_name: str) -> Any:
    """Check ``value`` against a field type; ints are accepted as floats, '1e-4' as a float.
    A float must be finite (no field gives ``inf`` or ``nan`` a meaning)."""
    want = _TYPES[type_name]
    if want is float:
        value = _as_float(key, value)
    if not (is_integer(value) if want is int else isinstance(value, want)):
        raise ConfigError(
            f"{key}: expected {type_name}, got {type(value).__name__} {value!r}"
        )
    return value


def _as_float(key: str, value: Any) -> Any:
    """``value`` as a finite float when it is a number or a numeric string; else unchanged."""
    if not (is_number(value) or isinstance(value, str)):
        return value
    try:
        number = float(value)
    except ValueError:  # a non-numeric string: reported as a wrong type
        return value
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        text = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:30]}..."
        raise ConfigError(f"{key}: invalid value {text}; must be a finite number")
    return number


def _from_mapping(cls: type, data: dict, prefix: str) -> Any:
    """The dataclass ``cls`` from a YAML mapping, each value type-checked; an unknown or moved key
    fails naming it (and the closest valid key)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    moved = [f"{prefix}{k}" for k in unknown if f"{prefix}{k}" in _MOVED]
    if moved:
        raise ConfigError(f"{moved[0]} has moved: use {_MOVED[moved[0]]}")
    if unknown:
        hint = suggestion(unknown[0], known, prefix)
        raise ConfigError(f"unknown key {prefix}{unknown[0]}{hint}; valid keys: "
                          f"{', '.join(sorted(known))}")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _from_mapping(hint, value or {}, key + ".")
        else:
            kwargs[name] = _coerce(key, value, hint.__name__)
    return cls(**kwargs)


def from_dict(data: dict) -> Config:
    """Build and validate a config from a nested dict."""
    return _from_mapping(Config, data or {}, "").validate()


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
    return parts, parse_yaml(raw, f"override {item!r}", lines=False) if raw.strip() else ""


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


def _switch_rule() -> dict[str, tuple[str, ...]]:
    """``key naming a piece -> the keys that belong to the piece it names`` (from :data:`SLOTS`:
    a piece's params; a reward's name, params and components replace one another)."""
    rule: dict[str, tuple[str, ...]] = {}
    for slot in SLOTS:
        if slot.each:
            rule[slot.key] = (slot.params, slot.each)
            rule[slot.each] = (slot.key, slot.params)
        elif slot.params:
            rule[slot.key] = (slot.params,)
    rule["sampler.rollout"] = ("sampler.rollout_params",)  # the rollout registry's pair
    return rule


SWITCH_RULE = _switch_rule()
"""What a switched piece drops: ``--set sampler.name=ode`` on a file that names ``sde`` with
``sampler.params: {noise_level: 0.7}`` drops those params, so ``ode`` starts from its own
defaults (params the user gives in the same command are kept, and checked against ``ode``)."""

SWITCH_HELP = ("A key that names a piece (sampler.name, train.loss, train.objective, "
               "model.family, reward.name, ...) and its params key go together: when --set "
               "(or a keyword section, an ablation cell or a preset) switches the piece to "
               "another name, the params the config file wrote for the old piece are dropped "
               "and the new piece starts from its own defaults; params you give in the same "
               "command (key.params={...} or key.params.x=...) are kept and must fit the piece "
               "you chose. reward.name and reward.components replace one another the same way.")


def _default(key: str) -> Any:
    """The schema default of ``section.field``."""
    section, _, name = key.partition(".")
    cls = typing.get_type_hints(Config)[section]
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def written_keys(sections: dict | None = None, overrides: list[str] | None = None
                 ) -> dict[str, Any]:
    """``section.key -> value`` of what keyword sections and ``--set`` overrides write, later
    ones winning (a sub-key write such as ``sampler.params.eta=1`` is not listed: it adds to
    the params it finds, which a switch first empties)."""
    written: dict[str, Any] = {}
    for name, values in (sections or {}).items():
        if isinstance(values, dict):
            written.update({f"{name}.{key}": value for key, value in values.items()})
    for item in overrides or []:
        parts, value = parse_override(item)
        if len(parts) == 2:
            written[".".join(parts)] = value
    return written


def switch_pieces(data: dict, written: dict[str, Any]) -> list[str]:
    """Drop from ``data`` (config data as read) what belongs to each piece that ``written``
    switches to another name (:data:`SWITCH_RULE`), unless ``written`` sets it too; returns the
    keys dropped."""
    dropped = []
    for key, belongs in SWITCH_RULE.items():
        if key not in written:
            continue
        section, _, name = key.partition(".")
        node = data.get(section)
        node = node if isinstance(node, dict) else {}
        mixed = any(slot.key == key and node.get(slot.each.partition(".")[2])
                    for slot in SLOTS if slot.each)  # a single reward named over a mix
        if not mixed and written[key] == node.get(name, _default(key)):
            continue  # not a switch
        for other in belongs:
            other_section, _, other_name = other.partition(".")
            holder = data.get(other_section)
            if other not in written and isinstance(holder, dict) and other_name in holder:
                del holder[other_name]
                dropped.append(other)
    return dropped


def layer(data: dict, sections: dict | None = None, overrides: list[str] | None = None) -> dict:
    """Config data as read (a file, a saved config), then keyword ``sections``, then ``--set``
    ``overrides``, with the switch rule (:data:`SWITCH_RULE`) applied first (in place;
    returned)."""
    switch_pieces(data, written_keys(sections, overrides))
    return apply_overrides(merge_sections(data, sections or {}), overrides or [])


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                **sections: dict) -> Config:
    """Read a YAML config, apply overrides, validate.

    Args:
        path: a YAML file (default: the CPU digits job); a shipped recipe also by name
            (:func:`resolve_config`).
        overrides: ``section.key=value`` strings (values parsed as YAML), as ``--set`` takes.
        sections: keyword overrides per section, merged into the file's values before
            ``overrides``: ``load_config(run={"epochs": 5}, train={"lr": 1e-4})``.
    """
    return from_dict(layer(read_config(path), sections, overrides))


def read_config(path: str | Path | None = None) -> dict:
    """The sections of a YAML config file as read, not yet validated (default: the CPU digits
    job; a shipped recipe also by name, :func:`resolve_config`)."""
    path = resolve_config(path) if path else DEFAULT_CONFIG
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; pass a .yaml file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = parse_yaml(read_utf8(path), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def merge_sections(data: dict, sections: dict) -> dict:
    """Merge keyword overrides ``{section: {key: value}}`` into config data (in place; returned).
    Each key replaces the file's value, as ``--set section.key=value`` does."""
    for name, values in sections.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{name}: a section override is a dict of keys, got "
                              f"{type(values).__name__} {values!r}")
        section = data.get(name)
        if section is None:
            section = data[name] = {}
        if not isinstance(section, dict):
            raise ConfigError(f"{name}: expected a mapping, got {section!r}")
        section.update(values)
    return data


def describe_fields() -> str:
    """Every config key with its default and help text (``flowgrpo config --help-fields``); a key
    naming a piece lists the built-in names of its kind, read from its registry."""
    kinds = {slot.key: slot.kind for slot in SLOTS}
    lines = [*textwrap.wrap(f"# {SWITCH_HELP}", 96, subsequent_indent="# "), ""]
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        lines.append(f"{section.name}:")
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            text = f.metadata.get("help", "")
            kind = kinds.get(f"{section.name}.{f.name}")
            if kind:
                text += f"; built in: {', '.join(builtin_names(kind))}"
            lines.append(f"  {f.name} = {default!r}  # {text}")
    return "\n".join(lines)
