"""``flowgrpo.ablate`` is now ``flowgrpo.cli.ablate``."""

from flowgrpo import _alias

_alias(__name__)
