"""``flowgrpo.evaluate`` is now ``flowgrpo.training.evaluation``."""

from flowgrpo import _alias

_alias(__name__)
