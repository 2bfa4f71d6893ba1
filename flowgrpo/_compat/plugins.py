"""``flowgrpo.plugins`` is now ``flowgrpo.cli.catalogue``."""

from flowgrpo import _alias

_alias(__name__)
