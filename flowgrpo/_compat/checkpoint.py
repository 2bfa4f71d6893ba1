"""``flowgrpo.checkpoint`` is now ``flowgrpo.run.checkpoint``."""

from flowgrpo import _alias

_alias(__name__)
