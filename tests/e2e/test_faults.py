"""Faults handled by policy: reward errors and non-finite scores (stop, skip_group, retry),
non-finite gradients (skipped, counted, stopped after K in a row), and a stop that checkpoints
the epochs done so the run resumes exactly."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.config.schema import RewardConfig, RunConfig
from flowgrpo.errors import RunError
from flowgrpo.run.tracking import read_metrics
from flowgrpo.training.reward_runner import RewardRunner, RewardStop
from flowgrpo.training.trainer import Trainer
from helpers.toy import config, stable, weights
from reward_models import REWARDS, RewardOutput


class Adapter:
    modality, sample_rate = "image", None


@pytest.fixture
def faulty():
    """``faulty_test``: the mean pixel, with a fault chosen by ``faulty.mode`` per call."""
    state = {"mode": "ok", "calls": 0, "fail_calls": set()}

    def factory():
        def reward(media, prompts, metadata):
            state["calls"] += 1
            n = len(prompts)
            scores = media.data.float().mean(dim=(1, 2, 3))
            # every call fails when fail_calls is empty, else only the calls listed
            fails = not state["fail_calls"] or state["calls"] in state["fail_calls"]
            mode = state["mode"] if fails else "ok"
            if mode == "raise":
                raise RuntimeError("scorer crashed\nsecond line")
            if mode == "nan":
                scores = scores.clone()
                scores[[1, 6]] = float("nan")
            return RewardOutput(scores[:n - 1] if mode == "short" else scores)

        return reward

    with REWARDS.registered("faulty_test", factory):
        yield state


def runner(**run) -> RewardRunner:
    return RewardRunner(RewardConfig(name="faulty_test"), Adapter(), RunConfig(**run))


def media(n: int = 8) -> torch.Tensor:
    return torch.rand(n, 3, 4, 4)


GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def collect(r: RewardRunner, n: int = 8):
    return r.collect([r.submit(media(n), ["p"] * n, [{}] * n)], GROUPS[:n])


@pytest.mark.parametrize("mode,policy,message", [
    ("raise", "stop", "reward faulty_test raised RuntimeError: scorer crashed "
                      "(run.on_reward_error: stop)"),
    ("short", "stop", "faulty_test returned 7 scores for 8 samples (run.on_reward_error: stop)"),
    ("raise", "retry", "reward faulty_test raised RuntimeError: scorer crashed after 3 tries "
                       "(run.on_reward_error: retry)"),
])
def test_reward_errors_stop_with_one_line(faulty, mode, policy, message):
    faulty["mode"] = mode
    with pytest.raises(RewardStop) as err:
        collect(runner(on_reward_error=policy, reward_retries=2))
    assert str(err.value) == message
    assert faulty["calls"] == (3 if policy == "retry" else 1)


def test_nan_scores_stop_or_skip_their_groups(faulty):
    faulty["mode"] = "nan"
    with pytest.raises(RewardStop, match=r"^faulty_test returned 2 NaN of 8 \(run.on_nonfinite"):
        collect(runner(on_nonfinite="stop"))
    r = runner(on_nonfinite="skip_group")
    out, valid = r.collect([r.submit(media(), ["p"] * 8, [{}] * 8)],
                           torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    # samples 1 and 6 are NaN: their groups 0 and 3 are skipped whole, and read 0
    assert valid.tolist() == [False, False, True, True, True, True, False, False]
    assert out.scores[~valid].eq(0).all() and torch.isfinite(out.scores).all()


def test_a_retry_that_succeeds_and_a_skipped_chunk(faulty):
    faulty["mode"], faulty["fail_calls"] = "raise", {1}
    out, valid = collect(runner(on_reward_error="retry"))
    assert bool(valid.all()) and faulty["calls"] == 2 and torch.isfinite(out.scores).all()
    faulty["calls"], faulty["fail_calls"] = 0, {1}
    r = runner(on_reward_error="skip_group")
    pending = [r.submit(media(4), ["p"] * 4, [{}] * 4), r.submit(media(4), ["p"] * 4, [{}] * 4)]
    out, valid = r.collect(pending, GROUPS)
    assert valid.tolist() == [False] * 4 + [True] * 4
    assert out.scores[:4].eq(0).all() and out.scores[4:].gt(0).all()


def test_skipped_groups_are_not_trained(faulty, tmp_path):
    faulty["mode"], faulty["fail_calls"] = "raise", {1}  # the first chunk of epoch 0
    t = Trainer.from_config(config(tmp_path, "reward.name=faulty_test",
                                   "run.on_reward_error=skip_group", "train.sample_batch_size=4",
                                   "run.epochs=1", "train.beta=0.01"))
    batch = t.sample(0)
    assert batch.valid.tolist() == [False] * 4 + [True] * 4
    adv, metrics = t.advantages(batch)
    assert adv[~batch.valid].eq(0).all() and adv[batch.valid].abs().sum() > 0
    assert metrics["reward/skipped_samples"] == 4
    out = t.update(batch, adv, 0)
    assert out["train/samples"] == 4  # beta > 0 trains every usable sample, and only those


@pytest.mark.slow
def test_a_reward_stop_checkpoints_the_epochs_done_and_resumes_exactly(faulty, tmp_path):
    clean = tmp_path / "clean"
    t = Trainer.from_config(config(clean, "reward.name=faulty_test", "run.epochs=3",
                                   "run.save_every=0"))
    t.train()
    final, rows = weights(t), read_metrics(clean)
    run = tmp_path / "run"
    faulty.update(mode="raise", calls=0, fail_calls={5})  # eval, epochs 0-1, eval, epoch 2
    cfg = config(run, "reward.name=faulty_test", "run.epochs=3", "run.save_every=0",
                 "run.on_reward_error=stop")
    with pytest.raises(RunError, match=r"^reward faulty_test raised RuntimeError: scorer "
                       r"crashed \(run.on_reward_error: stop\); stopped at step 2 \(checkpoint "
                       r"step_2 holds the 2 epochs done"):
        Trainer.from_config(cfg).train()
    faulty["fail_calls"] = {-1}
    resumed = Trainer.from_config(cfg, resume="auto")
    assert resumed.start_epoch == 2
    resumed.train()
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), final))
    assert stable(read_metrics(run)) == stable(rows)


def test_nonfinite_gradients_are_skipped_counted_and_stop_after_k(tmp_path, monkeypatch):
    t = Trainer.from_config(config(tmp_path, "run.epochs=1", "run.max_nonfinite_steps=2",
                                   "train.train_batch_size=4"))
    loss = t.objective.loss

    def poisoned(batch, state, idx, unit):
        value, metrics = loss(batch, state, idx, unit)
        return value * float("nan"), metrics

    monkeypatch.setattr(t.objective, "loss", poisoned)
    before = weights(t)
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    with pytest.raises(RunError, match=r"^2 optimizer steps in a row had a non-finite loss"):
        t.update(batch, adv, 0)
    assert all(torch.equal(a, b) for a, b in zip(weights(t), before))  # no step was taken
    # one bad step among good ones is skipped and counted; the run goes on
    monkeypatch.setattr(t, "nonfinite_run", 0)
    monkeypatch.setattr(t.cfg.run, "max_nonfinite_steps", 3)
    out = t.update(batch, adv, 0)
    assert out["train/nonfinite_steps"] == 2 and t.nonfinite_run == 2
