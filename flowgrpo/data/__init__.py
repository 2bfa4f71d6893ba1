"""What a run reads besides its config: prompt sets (``prompts``), the built-in hard TTS prompts
(``tts_prompts``) and the files shipped with the package (``files``)."""

from flowgrpo.data.prompts import (  # noqa: F401  (the public names)
    BUILTIN,
    PATH_KEYS,
    Prompt,
    load_prompts,
    sample_groups,
)
