"""The generalised GRPO core: one update loop over registered objectives, step selections,
credits and views, with today's default behaviour kept."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import samplers
from flowgrpo.config.io import load_config
from flowgrpo.rl import losses
from flowgrpo.rl.credit import CREDITS
from flowgrpo.rl.kl import exact_kl
from flowgrpo.rl.objectives import OBJECTIVES
from flowgrpo.rl.replay import replay_step
from flowgrpo.rl.rollout import RolloutSpec, rollout, solve
from flowgrpo.rl.step_selection import STEP_SELECTIONS
from flowgrpo.seeding import hash_seed
from flowgrpo.training.trainer import Trainer
from helpers.tiny_runs import make_config
from helpers.toy import assert_ratio_one, lora, toy_trainer


def reference_update(t: Trainer, batch, adv: torch.Tensor, epoch: int) -> dict:
    """The update of the first trainer (one advantage per sample, one shared list of trained
    steps, per-step replay + clip loss + beta * KL), written out plainly."""
    cfg = t.cfg.train
    keep = torch.arange(len(adv))[adv != 0]
    size = cfg.train_batch_size or cfg.batch_size
    steps = batch.traj.num_trained
    gen = torch.Generator().manual_seed(hash_seed(t.cfg.run.seed, epoch, 2))
    sums, count = {}, 0
    order = keep[torch.randperm(len(keep), generator=gen)]
    for m in range(math.ceil(len(keep) / size)):
        idx = order[m * size:(m + 1) * size]
        for j in range(steps):
            result = replay_step(t.adapter, t.sampler, batch.traj, idx, j, t.cfg.model.guidance,
                                 kl=exact_kl)
            loss, metrics = losses.get(cfg.loss)(result.log_prob, batch.traj.log_probs[idx, j],
                                                 adv[idx], **cfg.loss_params)
            kl = result.kl.mean()
            loss = loss + cfg.beta * kl
            metrics.update({"train/kl": kl.detach(), "train/loss": loss.detach()})
            (loss / steps).backward()
            for key, value in metrics.items():  # metrics are means over the trained samples
                sums[key] = sums.get(key, 0.0) + float(value) * len(idx)
            count += len(idx)
        torch.nn.utils.clip_grad_norm_(t.params, cfg.max_grad_norm)
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=True)
    return {k: v / count for k, v in sums.items()}


@pytest.mark.slow
def test_default_job_update_equals_the_plain_per_step_update(tmp_path):
    """The default job through the generic loop (objective ``ratio``, selection ``all``, credit
    ``outcome``, no views) moves the weights and reports the metrics of the plain loop, exactly,
    over two epochs."""
    new, ref = toy_trainer(tmp_path / "a"), toy_trainer(tmp_path / "b")
    for epoch in range(2):
        batch_new, batch_ref = new.sample(epoch), ref.sample(epoch)
        assert torch.equal(batch_new.traj.latents, batch_ref.traj.latents)
        adv_new, _ = new.advantages(batch_new)
        adv_ref, _ = ref.advantages(batch_ref)
        assert adv_new.shape == (16, 1, 1, 1)
        got = new.update(batch_new, adv_new, epoch)
        want = reference_update(ref, batch_ref, adv_ref.flatten(), epoch)
        for key, value in want.items():
            assert got[key] == value, key
        a, b = lora(new), lora(ref)
        assert all(torch.equal(a[k], b[k]) for k in a)


def contract_cases() -> list[tuple[str, str, str, int]]:
    """Every combination of objective, step selection, credit and views (0 or 1) that the config
    accepts (likelihood-free objectives take one outcome advantage per sample)."""
    from flowgrpo.errors import ConfigError

    cases = []
    for o in [n for n in OBJECTIVES.names() if OBJECTIVES.get(n).anchored]:
        for s in STEP_SELECTIONS.names():
            for c, v in [(c, 0) for c in CREDITS.names()] + [("outcome", 1)]:
                try:
                    load_config(None, [f"train.objective={o}", f"train.step_selection={s}",
                                       f"train.credit={c}", f"train.views={v}"])
                except ConfigError:
                    continue
                cases.append((o, s, c, v))
    return cases


@pytest.mark.parametrize("objective,selection,credit,views", contract_cases(),
                         ids=lambda v: str(v))
def test_ratio_is_one_before_the_first_update_on_the_toy(tmp_path, objective, selection, credit,
                                                         views):
    t = toy_trainer(tmp_path, f"train.objective={objective}",
                    f"train.step_selection={selection}", f"train.credit={credit}",
                    f"train.views={views}", "train.beta=0.01")
    assert_ratio_one(t)


DISCRETE = str(Path(__file__).resolve().parents[2] / "configs" / "digits_discrete.yaml")
DISCRETE_TINY = ["train.batch_size=8", "train.group_size=4", "sampler.num_steps=6",
                 "data.eval_images_per_prompt=1", "run.tensorboard=false", "run.progress=false"]


def discrete_contract_cases() -> list[tuple[str, str, str, int, str]]:
    """The same combinations on the discrete toy (configs/digits_discrete.yaml): what the config
    accepts for a token model, on each token path's shipped model."""
    from flowgrpo.errors import ConfigError

    cases = []
    # flash's rectification and tempflow's noise weight are a Gaussian's (refused for tokens):
    # they run without
    selections = [*STEP_SELECTIONS.names(), "flash:{rectify: false}",
                  "tempflow:{noise_aware: false}"]
    for o in [n for n in OBJECTIVES.names() if OBJECTIVES.get(n).anchored]:
        for s in selections:
            for c, v in [(c, 0) for c in CREDITS.names()] + [("outcome", 1)]:
                try:
                    load_config(DISCRETE, [f"train.objective={o}", *_selection(s),
                                           f"train.credit={c}", f"train.views={v}"])
                except ConfigError:
                    continue
                # every path on the plain combination, the masked one on the others
                paths = ("masked", "uniform", "metric") if (s, c, v) == ("all", "outcome", 0) \
                    else ("masked",)
                cases += [(o, s, c, v, path) for path in paths]
    return cases


def _selection(value: str) -> list[str]:
    name, _, params = value.partition(":")
    return [f"train.step_selection={name}", *([f"train.step_selection_params={params}"]
                                              if params else [])]


def test_the_discrete_contract_covers_both_discrete_objectives():
    cases = discrete_contract_cases()
    assert {case[0] for case in cases} >= {"dflow_grpo", "udm_grpo"}
    assert {case[1] for case in cases if case[0] == "dflow_grpo"} >= {
        "all", "window", "flash:{rectify: false}"}


@pytest.mark.parametrize("overrides,message", [
    (["train.credit=turning_point"], "train.credit: .*needs continuous states"),
    (["train.step_selection=flash"], "rectify: false"),
])
def test_gaussian_only_pieces_are_refused_for_a_token_model(overrides, message):
    from flowgrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(DISCRETE, overrides)


@pytest.mark.parametrize("objective,selection,credit,views,path", discrete_contract_cases(),
                         ids=lambda v: str(v))
def test_ratio_is_one_before_the_first_update_on_the_discrete_toy(
        tmp_path, objective, selection, credit, views, path):
    cfg = load_config(DISCRETE, [f"run.output_dir={tmp_path}", *DISCRETE_TINY,
                                 f"model.path=digits_discrete_{path}",
                                 f"train.objective={objective}",
                                 *_selection(selection), f"train.credit={credit}",
                                 f"train.views={views}", "train.beta=0.01"])
    assert_ratio_one(Trainer.from_config(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("objective,selection,credit,views", contract_cases(),
                         ids=lambda v: str(v))
def test_ratio_is_one_before_the_first_update_on_tiny_sd3_with_cfg(
        tiny_sd3_dir, tmp_path, brightness_reward, objective, selection, credit, views):
    cfg = make_config(tiny_sd3_dir, tmp_path, brightness_reward, model={"guidance": 3.0},
                      train={"objective": objective, "step_selection": selection,
                             "credit": credit, "views": views, "beta": 0.1})
    assert_ratio_one(Trainer.from_config(cfg))


def test_cfg_free_training_replays_unguided_with_ratio_one(tiny_sd3_dir, tmp_path,
                                                          brightness_reward):
    """CFG-free training: rollouts with CFG 3, replays at guidance 1. The old log-probs are the
    unguided policy's (recomputed), not the sampling ones, so the ratio is 1 before the update;
    the replay really is unguided (its log-probs differ from the guided sampling ones)."""
    t = Trainer.from_config(make_config(tiny_sd3_dir, tmp_path, brightness_reward,
                                        model={"guidance": 3.0},
                                        train={"objective_params": {"guidance": 1.0},
                                               "beta": 0.1}))
    assert t.objective.guidance == 1.0 and t.cfg.model.guidance == 3.0
    assert_ratio_one(t)
    from flowgrpo.training.trainer import canonical_advantages

    batch = t.sample(0)
    batch.advantages = canonical_advantages(t.advantages(batch)[0], batch)
    state = t.objective.prepare(batch)[:, 0, :, 0]
    idx = torch.arange(len(batch.groups))
    unguided = replay_step(t.adapter, t.sampler, batch.traj, idx, 0, 1.0).log_prob
    guided = replay_step(t.adapter, t.sampler, batch.traj, idx, 0, 3.0).log_prob
    torch.testing.assert_close(state[:, 0], unguided, rtol=0, atol=1e-6)
    torch.testing.assert_close(batch.traj.log_probs[:, 0], guided, rtol=0, atol=1e-6)
    assert (state - batch.traj.log_probs).abs().max() > 1e-3


def test_model_calls_are_counted_per_sample_with_cfg_twice(tiny_sd3_dir, tmp_path,
                                                          brightness_reward):
    t = Trainer.from_config(make_config(tiny_sd3_dir, tmp_path, brightness_reward,
                                        model={"guidance": 3.0}, train={"beta": 0.1},
                                        run={"epochs": 1, "eval_every": 1}))
    row = t.train()
    # 8 samples, 4 steps, CFG doubles every call: rollout 8*4*2; reference and training
    # replay the 3 trained steps (the last is never trained)
    assert row["calls/nograd"] == 8 * 4 * 2 + 8 * 3 * 2
    assert row["calls/grad"] == 8 * 3 * 2
    assert row["calls/nograd_total"] == row["calls/nograd"]  # eval is not counted


def test_zero_advantages_with_a_kl_term_still_train_toward_the_reference(
        tiny_sd3_dir, tmp_path, brightness_reward):
    """With beta > 0, skipping a zero-advantage sample would drop its KL gradient: it is kept."""
    t = Trainer.from_config(make_config(tiny_sd3_dir, tmp_path, brightness_reward,
                                        train={"beta": 1.0, "lr": 1e-2, "weight_decay": 0.0}))
    with torch.no_grad():  # move the policy away from the reference first
        for name, p in t.adapter.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    batch = t.sample(0)
    zeros = torch.zeros(len(batch.groups))
    first = t.update(batch, zeros, 0)
    second = t.update(batch, zeros, 0)
    assert first["train/samples"] == 8
    assert first["train/kl"] > 0
    assert second["train/kl"] < first["train/kl"]


def test_solve_equals_a_deterministic_rollout(tmp_path):
    t = toy_trainer(tmp_path)
    sigmas = t.adapter.schedule(10)
    noise = t.adapter.noise(4, torch.Generator().manual_seed(0))
    cond = t.session.encode(["a handwritten digit 3"] * 4)
    none = torch.zeros(4, 0, dtype=torch.long)
    traj = rollout(t.adapter, RolloutSpec(t.sampler), cond, noise, sigmas, none)
    euler = solve(t.adapter, noise, sigmas, cond, 1.0)
    assert torch.equal(traj.final, euler)
    # a completion from the middle of the deterministic path lands on the same sample
    assert torch.equal(solve(t.adapter, traj.latents[:, 4], sigmas[4:], cond, 1.0), euler)
    dpm = solve(t.adapter, noise, sigmas, cond, 1.0, method="dpm2")  # accuracy: test_dpm.py
    assert torch.isfinite(dpm).all() and not torch.equal(dpm, euler)


def test_per_sample_steps_are_stochastic_only_where_selected(tmp_path):
    t = toy_trainer(tmp_path, "train.step_selection=flash")
    batch = t.sample(3)
    traj = batch.traj
    assert traj.trained.shape == (16, 1)
    ode = samplers.get("ode")
    for i in range(16):
        k_train = int(traj.trained[i, 0])
        for k in range(len(traj.sigmas) - 1):
            x = traj.latents[i:i + 1, k].float()
            v = t.adapter.velocity(x, traj.sigmas[k].expand(1), traj.cond.index([i]), 1.0)
            euler = ode.transition(v, x, float(traj.sigmas[k]), float(traj.sigmas[k + 1])).mean
            gap = (traj.latents[i:i + 1, k + 1] - euler).abs().max()
            assert (gap > 1e-3) if k == k_train else (gap < 1e-5), (i, k, float(gap))


def test_libraries_import_only_the_ground_of_flowgrpo():
    """The libraries stand alone: of flowgrpo they import only its ground modules (registry,
    errors, seeding, validation; ``flowgrpo.layers``), never the trainer or the config."""
    from flowgrpo.layers import GROUND

    code = ("import sys, samplers, pipelines, reward_models; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'flowgrpo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert {"flowgrpo", "flowgrpo.errors", "flowgrpo.registry"} <= set(out)
    assert set(out) - {"flowgrpo"} <= set(GROUND), sorted(set(out) - {"flowgrpo"} - set(GROUND))


def test_cond_index_reuses_the_last_sub_batch_only_for_the_same_index_tensor():
    from pipelines import Cond

    cond = Cond({"a": torch.arange(10.0), "b": torch.arange(20.0).reshape(10, 2)})
    idx = torch.tensor([3, 1, 7])
    first = cond.index(idx)
    assert cond.index(idx) is first  # replaying another step of the same minibatch
    assert torch.equal(first.tensors["b"], torch.tensor([[6.0, 7.0], [2.0, 3.0], [14.0, 15.0]]))
    other = cond.index(torch.tensor([3, 1, 7]))  # equal values, another tensor: gathered anew
    assert other is not first and torch.equal(other.tensors["a"], first.tensors["a"])
    assert torch.equal(cond.index([0, 9]).tensors["a"], torch.tensor([0.0, 9.0]))


def _stacked_update(out, per: int, views: int):
    """One toy update with ``steps_per_call = per``: the gradient of its optimizer step, its
    metrics, the transformer calls with grad and the number of units."""
    from flowgrpo.training.trainer import canonical_advantages

    t = toy_trainer(out, f"train.objective_params={{steps_per_call: {per}}}",
                    "train.beta=0.01", f"train.views={views}")
    assert_ratio_one(t)
    batch = t.sample(0)
    t.views.extend(t.session, t.rewards.score, batch, 0)
    units = t.objective.units(batch)
    calls, grads = [], []
    hook = t.adapter.transformer.register_forward_pre_hook(
        lambda m, a, kw: calls.append(torch.is_grad_enabled()), with_kwargs=True)
    adv, _ = t.advantages(batch)
    batch.advantages = canonical_advantages(adv, batch)
    step = t.optimizer.step

    def record_then_step(*args, **kwargs):
        grads.extend(p.grad.clone() for p in t.params)
        return step(*args, **kwargs)

    t.optimizer.step = record_then_step
    metrics = t.update(batch, adv, 0)
    hook.remove()
    return grads, metrics, sum(calls), len(units)


@pytest.mark.parametrize("views", [0, 1])
def test_stacked_steps_replay_in_one_call_with_ratio_one_and_the_same_update(tmp_path, views):
    """``objective_params.steps_per_call``: 4 trained steps per transformer call (the last call
    takes the rest). Before the update every ratio is 1; the update's gradient and its metrics
    equal one step per call's, with 3 grad calls per minibatch and view instead of 9."""
    (w1, m1, grad1, u1), (w4, m4, grad4, u4) = (_stacked_update(tmp_path / str(per), per, views)
                                                for per in (1, 4))
    assert (u1, u4) == (9 * (views + 1), 3 * (views + 1))
    assert (grad1, grad4) == (u1, u4)
    for key in ("train/loss", "train/kl", "train/ratio_mean", "train/clipfrac"):
        assert m4[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-9), key
    assert len(w1) == len(w4) > 0  # the gradient of the update (Adam's first step is its sign)
    for a, b in zip(w4, w1):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-9)
