"""``flowgrpo.calls`` is now ``flowgrpo.training.calls``."""

from flowgrpo import _alias

_alias(__name__)
