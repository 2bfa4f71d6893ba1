"""``flowgrpo.engines`` is now ``flowgrpo.distributed``."""

from flowgrpo import _alias

_alias(__name__)
