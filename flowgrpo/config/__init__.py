"""The config: ``schema`` (plain dataclasses, one per section), ``pieces`` (the named pieces a
config refers to, checked against their registries) and ``io`` (YAML in and out, overrides)."""

from flowgrpo.config.schema import (  # noqa: F401  (the public names)
    COMPILE_MODES,
    DTYPES,
    Config,
    DataConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    SamplerConfig,
    TrainConfig,
    bind_params,
)
from flowgrpo.errors import ConfigError  # noqa: F401  (its old home)
