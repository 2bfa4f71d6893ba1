"""``flowgrpo.batch`` is now ``flowgrpo.rl.batch``."""

from flowgrpo import _alias

_alias(__name__)
