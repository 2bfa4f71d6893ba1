"""Model-family adapters: ``pipelines.load(family, path_or_id, **options)``."""

from . import sd3  # noqa: F401  (registers the family)
from .ace_step import AceStepAdapter  # noqa: F401  (registers the family)
from .amused import AmusedAdapter  # noqa: F401  (registers the family)
from .base import FAMILIES, Cond, FlowAdapter, load, names, register
from .digits_discrete import DigitsDiscreteAdapter  # noqa: F401  (registers the family)
from .discrete import DiscreteAdapter
from .f5_tts import F5TTSAdapter  # noqa: F401  (registers the family; f5-tts is optional)
from .flux import FluxAdapter  # noqa: F401  (registers the family)
from .flux2 import Flux2KleinAdapter  # noqa: F401  (registers the family)
from .flux_kontext import FluxKontextAdapter  # noqa: F401  (registers the family)
from .hunyuan_video import HunyuanVideoAdapter  # noqa: F401  (registers the family)
from .longcat_tts import LongCatTTSAdapter  # noqa: F401  (registers the family)
from .ltx import LTXAdapter  # noqa: F401  (registers the family)
from .ltx2 import LTX2Adapter  # noqa: F401  (registers the family)
from .qwen_image import QwenImageAdapter  # noqa: F401  (registers the family)
from .qwen_image_edit import QwenImageEditAdapter  # noqa: F401  (registers the families)
from .vq_diffusion import VQDiffusionAdapter  # noqa: F401  (registers the family)
from .wan import WanAdapter  # noqa: F401  (registers the family)
from .wan_i2v import WanI2VAdapter  # noqa: F401  (registers the family)
from .z_image import ZImageAdapter  # noqa: F401  (registers the family)

__all__ = ["FAMILIES", "Cond", "DiscreteAdapter", "FlowAdapter", "load", "names", "register"]
