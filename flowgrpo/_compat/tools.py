"""``flowgrpo.tools`` is now ``flowgrpo.cli.inference``."""

from flowgrpo import _alias

_alias(__name__)
