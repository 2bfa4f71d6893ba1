"""``flowgrpo.tts_prompts`` is now ``flowgrpo.data.tts_prompts``."""

from flowgrpo import _alias

_alias(__name__)
