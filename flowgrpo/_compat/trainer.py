"""``flowgrpo.trainer`` is now ``flowgrpo.training.trainer``."""

from flowgrpo import _alias

_alias(__name__)
