"""``flowgrpo.kl`` is now ``flowgrpo.rl.kl``."""

from flowgrpo import _alias

_alias(__name__)
