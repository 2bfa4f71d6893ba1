"""``flowgrpo.model`` is now ``flowgrpo.training.model_setup``."""

from flowgrpo import _alias

_alias(__name__)
