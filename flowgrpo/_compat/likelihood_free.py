"""``flowgrpo.likelihood_free`` is now ``flowgrpo.rl.objectives.likelihood_free``."""

from flowgrpo import _alias

_alias(__name__)
