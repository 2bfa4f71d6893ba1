"""The config: ``schema`` (plain dataclasses, one per section, with their value checks),
``checks`` (how a bad value is refused), ``pieces`` (the named pieces a config refers to, checked
against their registries) and ``io`` (YAML in and out, overrides)."""

from flowgrpo.config.pieces import bind_params  # noqa: F401  (a public name)
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
)
from flowgrpo.errors import ConfigError  # noqa: F401  (its old home)
