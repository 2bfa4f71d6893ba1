"""The faults a user can fix, each reported by the CLI as one line (no traceback unless
``--debug`` or ``FLOWGRPO_DEBUG=1``).

- :class:`FlowgrpoError`: the base; ``exit_code`` is what ``flowgrpo`` exits with.
- :class:`~flowgrpo.errors.ConfigError` (a bad config value, file or key) exits 2.
- :class:`RunError`: a run cannot start or continue (a folder that would be overwritten, a
  checkpoint that does not match, a reward that failed under ``run.on_reward_error: stop``).
- :class:`Interrupted`: SIGINT or SIGTERM, after the checkpoint was written (130 or 143).
"""

from __future__ import annotations


class FlowgrpoError(Exception):
    """A fault with a one-line message that says what to do."""

    exit_code = 1


class RunError(FlowgrpoError):
    """The run cannot start or go on; the last consistent checkpoint is kept."""


class Interrupted(FlowgrpoError):
    """The run stopped on a signal after writing a checkpoint."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ConfigError(FlowgrpoError, ValueError):
    """A bad configuration value; the message names the key, the value and what is allowed."""

    exit_code = 2


class PluginError(ConfigError):
    """A reference or an entry point that cannot be loaded (one line: what, where, why)."""


def one_line(err: BaseException, *, with_type: bool = False) -> str:
    """``err`` for a one-line report: the first line of its message (a library's message may run
    on into a paragraph or a traceback), prefixed ``Type: `` with ``with_type``; its type's name
    alone when it has no message."""
    lines = str(err).strip().splitlines()
    name = type(err).__name__
    if not lines:
        return name
    return f"{name}: {lines[0]}" if with_type else lines[0]
