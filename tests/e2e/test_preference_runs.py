"""The preference objectives train through the one trainer loop on the toy: two epochs each,
finite metrics, the margin logged and 0 at the first update (the policy is the reference)."""

from __future__ import annotations

import math

import pytest

from helpers.toy import toy_trainer


@pytest.mark.parametrize("objective", ["dgpo", "dpo", "sft"])
def test_preference_objective_trains_two_epochs_on_the_toy(tmp_path, objective):
    t = toy_trainer(tmp_path, "sampler.name=ode", "sampler.params={}", "train.beta=0.01",
                    f"train.objective={objective}", "run.epochs=2", "run.eval_every=0",
                    "run.save_every=0")
    first = t.epoch(0, _Bar())
    second = t.epoch(1, _Bar())
    for row in (first, second):
        assert math.isfinite(row["train/loss"]) and row["calls/grad"] > 0
    if objective != "sft":
        assert first["train/margin"] <= 1e-6 < second["train/margin"]


class _Bar:
    def set_postfix(self, **_):
        pass
