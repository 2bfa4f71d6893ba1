"""``flowgrpo.advantage_variants`` is now ``flowgrpo.rl.advantages.variants``."""

from flowgrpo import _alias

_alias(__name__)
