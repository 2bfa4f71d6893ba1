"""``flowgrpo.report`` is now ``flowgrpo.cli.report``."""

from flowgrpo import _alias

_alias(__name__)
