"""``flowgrpo.steps`` is now ``flowgrpo.rl.step_selection``."""

from flowgrpo import _alias

_alias(__name__)
