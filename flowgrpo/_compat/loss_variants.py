"""``flowgrpo.loss_variants`` is now ``flowgrpo.rl.losses.variants``."""

from flowgrpo import _alias

_alias(__name__)
