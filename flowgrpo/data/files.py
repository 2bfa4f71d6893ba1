"""Files a run reads: the configs, prompt sets and presets that ship with the package, and
UTF-8 text with a one-line error."""

from __future__ import annotations

from pathlib import Path

from flowgrpo.errors import ConfigError


def shipped_configs() -> Path:
    """The folder of the configs that ship with flowgrpo (``digits.yaml``, the recipes,
    ``prompts/``, ``presets/``, ``accelerate/``): ``flowgrpo/configs`` inside an installed
    distribution, the top-level ``configs/`` of a source checkout."""
    package = Path(__file__).resolve().parent.parent  # flowgrpo/
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


SHIPPED = shipped_configs()


def shipped_file(path: str | Path) -> Path:
    """A data file a config names (a prompt set, presets): ``path`` when it exists, else the
    shipped copy of a relative ``configs/...`` path."""
    path = Path(path)
    if path.exists() or path.is_absolute() or not path.parts or path.parts[0] != "configs":
        return path
    shipped = SHIPPED.joinpath(*path.parts[1:])
    return shipped if shipped.exists() else path


def read_utf8(path: Path, key: str | None = None) -> str:
    """The text of a UTF-8 file (a byte-order mark is dropped); a file that cannot be read or is
    not UTF-8 raises :class:`ConfigError` naming it (after ``key: `` when given)."""
    prefix = f"{key}: " if key else ""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{prefix}{path}: cannot be read ({err.strerror or err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{prefix}{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at line "
                          f"{line}); save it as UTF-8") from None
