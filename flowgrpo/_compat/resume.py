"""``flowgrpo.resume`` is now ``flowgrpo.run.resume``."""

from flowgrpo import _alias

_alias(__name__)
