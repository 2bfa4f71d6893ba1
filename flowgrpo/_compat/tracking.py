"""``flowgrpo.tracking`` is now ``flowgrpo.run.tracking``."""

from flowgrpo import _alias

_alias(__name__)
