"""``flowgrpo.config_io`` is now ``flowgrpo.config.io``."""

from flowgrpo import _alias

_alias(__name__)
