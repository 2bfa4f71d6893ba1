"""``flowgrpo.credit`` is now ``flowgrpo.rl.credit``."""

from flowgrpo import _alias

_alias(__name__)
