"""Advantage estimators: rewards of a group -> advantages (registry ``ADVANTAGES``).

``base`` holds the registry, the group statistics and the standard estimators; ``variants`` the
others, registered when this package is imported.
"""

from flowgrpo.rl.advantages import variants  # noqa: F401  (registers its pieces)
from flowgrpo.rl.advantages.base import (  # noqa: F401  (the public names)
    ADVANTAGES,
    AGGREGATIONS,
    RUNTIME_INPUTS,
    SUPPLIED,
    Estimator,
    Rewards,
    check_params,
    compute_advantages,
    estimator_params,
    get,
    global_std_advantages,
    group_advantages,
    mean_only_advantages,
    runtime_inputs,
    zero_std_groups,
)
