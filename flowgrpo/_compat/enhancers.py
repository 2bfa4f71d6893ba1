"""``flowgrpo.enhancers`` is now ``flowgrpo.rl.enhancers``."""

from flowgrpo import _alias

_alias(__name__)
