"""``flowgrpo.doctor`` is now ``flowgrpo.cli.doctor``."""

from flowgrpo import _alias

_alias(__name__)
