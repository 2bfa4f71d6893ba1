"""What the ``flowgrpo`` command shows: ``--quiet`` / default / ``--verbose``.

The command calls :func:`configure` once its arguments are parsed:

- ``NORMAL`` (the default): diffusers' and transformers' model-loading bars are hidden (hub
  download bars stay as they were), and each known-harmless library message of :data:`HARMLESS`
  is dropped by a filter on the one logger that emits it. Every other library warning prints as
  the library would print it: no library's log level is raised.
- ``QUIET``: the same, with the libraries' loggers at ERROR, no hub download bars, and none of
  flowgrpo's own progress bars (:func:`show_progress`) or notes (:func:`note`).

Everything flowgrpo itself prints goes through this module: :func:`note` (start-up and progress
lines, stdout, hidden by ``QUIET``), :func:`result` (what the command was asked for, stdout) and
:func:`warn` (stderr); under ``--quiet`` a command shows its results and warnings only.
- ``VERBOSE``: the libraries' loggers at INFO, their loading bars shown, nothing filtered.

Until :func:`configure` is called (the Python API), nothing here touches the libraries' logging.
Most commands import diffusers only when they load a model, so the libraries' levels and bars
are set by :func:`apply_to_libraries`, which
:func:`flowgrpo.training.model_setup.load_adapter` calls before it loads one (and
:func:`configure` for a library already imported): a command that loads no model does not pay
for importing diffusers.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any

QUIET, NORMAL, VERBOSE = -1, 0, 1
_level = NORMAL
_configured = False  # configure() was called: the libraries follow the level

LIBRARIES = ("diffusers", "transformers")
"""The libraries whose log level and loading bars :func:`configure` sets."""


@dataclass(frozen=True)
class Harmless:
    """A library log message known to be harmless where flowgrpo meets it.

    Attributes:
        logger: the logger that emits it; the filter sits on this logger alone, so the same
            library's other loggers, and this logger's other messages, are untouched.
        pattern: regular expression searched for in the formatted message.
        reason: why the message is harmless.
    """

    logger: str
    pattern: str
    reason: str


HARMLESS: tuple[Harmless, ...] = (
    Harmless(
        logger="diffusers.loaders.lora_base",
        pattern=r"^No LoRA keys associated to \w+ found with the prefix='text_encoder(_\d+)?'",
        reason="a flowgrpo LoRA trains the transformer only, so a pipeline-wide "
        "load_lora_weights (a transformer without load_lora_adapter) finds no keys for the "
        "text encoders it also tries",
    ),
)
"""Library messages that ``NORMAL`` and ``QUIET`` drop, each with the reason it is harmless."""


class _Drop(logging.Filter):
    """Drops the records of one logger whose message matches a :class:`Harmless` pattern."""

    def __init__(self, harmless: Harmless) -> None:
        super().__init__()
        self.harmless = harmless
        self.regex = re.compile(harmless.pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.regex.search(record.getMessage())


_filters: list[tuple[logging.Logger, _Drop]] = []
# per library: (log level, loading bars shown) before the first `configure` touched it
_baseline: dict[str, tuple[int, bool]] = {}
# huggingface_hub's download bars disabled before the first `configure`; None: not read yet
_hub_baseline: bool | None = None


def configure(level: int = NORMAL) -> None:
    """Set the console level for this process (``QUIET``, ``NORMAL`` or ``VERBOSE``).

    Calling it again replaces the previous level's settings (filters are never added twice; a
    switch to ``VERBOSE`` removes them)."""
    global _level, _configured
    if level not in (QUIET, NORMAL, VERBOSE):
        raise ValueError(f"console level must be QUIET, NORMAL or VERBOSE, got {level!r}")
    _level, _configured = level, True
    _remove_filters()
    if level != VERBOSE:
        for harmless in HARMLESS:
            target = logging.getLogger(harmless.logger)
            drop = _Drop(harmless)
            target.addFilter(drop)
            _filters.append((target, drop))
    apply_to_libraries(imported_only=True)


def apply_to_libraries(imported_only: bool = False) -> None:
    """Set diffusers' and transformers' log levels and loading bars, and the hub's download
    bars, for the current level (importing the libraries' logging modules unless
    ``imported_only``); nothing before :func:`configure` has been called."""
    global _hub_baseline
    if not _configured:
        return
    from huggingface_hub.utils import are_progress_bars_disabled

    if _hub_baseline is None:
        _hub_baseline = are_progress_bars_disabled()
    for library in LIBRARIES:
        name = f"{library}.utils.logging"
        module = sys.modules.get(name) if imported_only else importlib.import_module(name)
        if module is not None:
            _apply(library, module)
    _set_hub_bars(disabled=True if _level == QUIET else _hub_baseline)


def level() -> int:
    """The current console level."""
    return _level


def show_progress(enabled: bool) -> bool:
    """Whether a progress bar of flowgrpo's own is shown: ``enabled`` (the config's wish)
    unless the console is ``QUIET``."""
    return enabled and level() != QUIET


def note(message: str) -> None:
    """Print an informational line on stdout, unless the console is ``QUIET``."""
    if level() != QUIET:
        print(message, flush=True)


def result(message: str) -> None:
    """Print what a command was asked for (a table, metrics, a run's summary) on stdout, at
    every level."""
    print(message, flush=True)


def warn(message: str) -> None:
    """Print ``flowgrpo: warning: message`` on stderr, at every level."""
    print(f"flowgrpo: warning: {message}", file=sys.stderr, flush=True)


def reset() -> None:
    """Undo :func:`configure`: no filters, the libraries' levels and bars as they were before
    it, and the level back to ``NORMAL``."""
    global _level, _hub_baseline, _configured
    _remove_filters()
    for library, (verbosity, bars) in _baseline.items():
        module = sys.modules.get(f"{library}.utils.logging")
        if module is not None:
            module.set_verbosity(verbosity)
            _set_library_bars(module, bars)
    if _hub_baseline is not None:
        _set_hub_bars(disabled=_hub_baseline)
    _baseline.clear()
    _hub_baseline = None
    _level, _configured = NORMAL, False


def _remove_filters() -> None:
    while _filters:
        target, drop = _filters.pop()
        target.removeFilter(drop)


def _apply(library: str, module: Any) -> None:
    """Set ``library``'s log level and loading bars (its ``utils.logging`` ``module``) for the
    current level."""
    if library not in _baseline:
        bars = module.is_progress_bar_enabled()
        if library == "transformers" and _hub_baseline is not None:
            # transformers starts with the hub's bar setting, which `configure` may have changed
            bars = not _hub_baseline
        _baseline[library] = (module.get_verbosity(), bars)
    verbosity = _baseline[library][0]
    module.set_verbosity({QUIET: logging.ERROR, VERBOSE: logging.INFO}.get(_level, verbosity))
    _set_library_bars(module, _level == VERBOSE)


def _set_library_bars(module: Any, shown: bool) -> None:
    # transformers' switch also flips the hub's download bars, which `_set_hub_bars` then sets;
    # the hub warns when an environment variable overrides the switch
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Cannot (en|dis)able progress bars")
        (module.enable_progress_bar if shown else module.disable_progress_bar)()


def _set_hub_bars(disabled: bool) -> None:
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if are_progress_bars_disabled() == disabled:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Cannot (en|dis)able progress bars")
        (disable_progress_bars if disabled else enable_progress_bars)()
