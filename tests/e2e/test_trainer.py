"""The GRPO trainer on a tiny SD3 pipeline built in code (LoRA), end to end on CPU."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.rl.replay import replay_step
from helpers.tiny_runs import make_config


def trainer_for(path, out, reward_name, **sections):
    from flowgrpo.training.trainer import Trainer

    return Trainer.from_config(make_config(path, out, reward_name, **sections))


def snapshot(trainer):
    pipe = trainer.adapter.pipeline
    out = {}
    for name in ("transformer", "text_encoder", "text_encoder_2", "vae"):
        for key, p in getattr(pipe, name).named_parameters():
            out[f"{name}.{key}"] = p.detach().clone()
    return out


@pytest.mark.parametrize("sampler", ["sde", "cps", "langevin"])
def test_ratio_is_one_before_any_update(tiny_sd3_dir, tmp_path, brightness_reward, sampler):
    params = {"velocity": "model"} if sampler == "langevin" else {}
    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward,
                    sampler={"name": sampler, "params": params}, model={"guidance": 3.0})
    batch = t.sample(0)
    idx = torch.arange(len(batch.groups))
    # cps and langevin skip the step into s' < 0.02
    assert batch.traj.num_trained == (2 if sampler in ("cps", "langevin") else 3)
    for j in range(batch.traj.num_trained):
        logp = replay_step(t.adapter, t.sampler, batch.traj, idx, j, 3.0).log_prob
        ratio = torch.exp(logp - batch.traj.log_probs[:, j])
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0), ratio


@pytest.mark.slow
def test_zero_advantages_leave_weights_unchanged(tiny_sd3_dir, tmp_path, brightness_reward):
    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward,
                    train={"weight_decay": 0.0, "skip_zero_advantage": False})
    batch = t.sample(0)
    before = snapshot(t)
    metrics = t.update(batch, torch.zeros(len(batch.groups)), 0)
    assert metrics["train/samples"] == 8  # the update really ran over every sample
    after = snapshot(t)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_zero_advantages_are_skipped(tiny_sd3_dir, tmp_path, brightness_reward):
    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward)
    batch = t.sample(0)
    before = snapshot(t)
    metrics = t.update(batch, torch.zeros(len(batch.groups)), 0)
    assert metrics["train/samples"] == 0
    assert all(torch.equal(before[k], v) for k, v in snapshot(t).items())


def test_one_step_changes_only_trainable_weights(tiny_sd3_dir, tmp_path, brightness_reward):
    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward, train={"beta": 0.1})
    batch = t.sample(0)
    adv, metrics = t.advantages(batch)
    assert metrics["rollout/zero_std_frac"] < 1
    before = snapshot(t)
    out = t.update(batch, adv, 0)
    assert out["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # single pass: before update
    assert "train/kl" in out
    after = snapshot(t)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "no weight changed"
    assert all("lora_" in k for k in changed), sorted(changed)[:5]


def test_full_finetune_reference_is_frozen_copy(tiny_sd3_dir, tmp_path, brightness_reward):
    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward, model={"lora": False},
                    train={"beta": 0.5})
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    t.update(batch, adv, 0)
    ref = t.adapter.reference_copy.state_dict()
    moved = [k for k, v in t.adapter.transformer.state_dict().items()
             if not torch.equal(v.float(), ref[k].float())]
    assert moved  # the policy moved, the reference did not
    assert all(not p.requires_grad for p in t.adapter.reference_copy.parameters())


@pytest.mark.slow
def test_saved_lora_reproduces_eval_images_in_fresh_pipeline(tiny_sd3_dir, tmp_path,
                                                             brightness_reward):
    from diffusers import StableDiffusion3Pipeline

    from flowgrpo.training.evaluation import generate
    from pipelines.sd3 import SD3Adapter

    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward, run={"epochs": 2})
    t.train()
    folder = tmp_path / "checkpoints" / "step_2" / "lora"
    assert (folder / "pytorch_lora_weights.safetensors").is_file()
    prompts, seeds = ["a handwritten digit 3", "a handwritten digit 5"], [11, 12]
    trained = generate(t.adapter, t.adapter.encode_inputs, prompts, seeds, 4, 1.0, 2)
    pipe = StableDiffusion3Pipeline.from_pretrained(tiny_sd3_dir, text_encoder_3=None,
                                                    tokenizer_3=None)
    base = SD3Adapter(pipeline=pipe)
    untrained = generate(base, base.encode_inputs, prompts, seeds, 4, 1.0, 2)
    pipe.load_lora_weights(str(folder))
    reloaded = generate(base, base.encode_inputs, prompts, seeds, 4, 1.0, 2)
    assert (trained - untrained).abs().max() > 1e-4  # training changed the images
    torch.testing.assert_close(reloaded, trained, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_resume_auto_continues_from_checkpoint(tiny_sd3_dir, tmp_path, brightness_reward):
    from flowgrpo.run.tracking import read_metrics
    from flowgrpo.training.trainer import Trainer

    first = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward, run={"epochs": 2})
    first.train()
    saved = [p.detach().clone() for p in first.params]
    cfg = make_config(tiny_sd3_dir, tmp_path, brightness_reward, run={"epochs": 3})
    second = Trainer.from_config(cfg, resume="auto")
    assert second.start_epoch == 2
    for a, b in zip(saved, second.params):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert second.optimizer.state_dict()["state"], "optimizer state not restored"
    second.train()
    rows = read_metrics(tmp_path)
    steps = [r["step"] for r in rows]
    assert steps == [0, 1, 2, 3]  # continued at step 3, no restart at 0
    # the running model-call totals continue too (every epoch makes the same calls here)
    assert rows[3]["calls/nograd_total"] == 3 * rows[1]["calls/nograd"] > 0
    assert (tmp_path / "checkpoints" / "step_3" / "state.json").is_file()


@pytest.mark.slow
def test_async_rewards_give_the_same_metrics_as_inline(tiny_sd3_dir, tmp_path, brightness_reward):
    from flowgrpo.run.tracking import read_metrics

    rows = []
    for workers in (0, 2):
        out = tmp_path / f"w{workers}"
        trainer_for(tiny_sd3_dir, out, brightness_reward, run={"epochs": 2, "save_every": 0},
                    reward={"async_workers": workers},
                    train={"sample_batch_size": 4}).train()  # two chunks: real overlap
        rows.append([{k: v for k, v in r.items() if not k.startswith("time/")}
                     for r in read_metrics(out)])
    assert rows[0] == rows[1]


def test_an_epoch_with_only_equal_rewards_trains_nothing_and_logs(tiny_sd3_dir, tmp_path):
    from flowgrpo.run.tracking import read_metrics
    from reward_models import REWARDS, RewardOutput

    with REWARDS.registered("constant_test", lambda: lambda media, prompts, metadata:
                            RewardOutput(torch.ones(len(prompts)))):
        trainer_for(tiny_sd3_dir, tmp_path, "constant_test",
                    run={"epochs": 1, "save_every": 0, "progress": True}).train()
    row = read_metrics(tmp_path)[-1]
    assert row["rollout/zero_std_frac"] == 1.0 and row["train/samples"] == 0


def test_reference_switches_the_lora_off_exactly_as_diffusers_does(tiny_sd3_dir, tmp_path,
                                                                   brightness_reward):
    """``reference()`` toggles cached LoRA layers: inside, the output is the base model's (what
    diffusers' ``disable_adapters`` gives); after, the LoRA is active and trainable again."""
    from flowgrpo.distributed import unwrap
    from flowgrpo.rl.reference import lora_layers, reference

    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward, model={"guidance": 3.0})
    model = unwrap(t.adapter.transformer)
    for p in t.params:  # a LoRA that changes the output
        p.data.add_(0.05 * torch.randn_like(p))
    cond = t.session.encode(["a red square", "a blue circle"])
    x = t.adapter.noise(2, torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.6)
    with torch.no_grad():
        with reference(t.adapter):
            ref = t.adapter.velocity(x, sigma, cond, 3.0)
        tuned = t.adapter.velocity(x, sigma, cond, 3.0)
        model.disable_adapters()
        base = t.adapter.velocity(x, sigma, cond, 3.0)
        model.enable_adapters()
        again = t.adapter.velocity(x, sigma, cond, 3.0)
    assert torch.equal(ref, base) and torch.equal(tuned, again)
    assert not torch.allclose(ref, tuned)
    assert lora_layers(model) and all(p.requires_grad for p in t.params)


@pytest.mark.slow
def test_compiled_transformer_trains_like_the_eager_one(tiny_sd3_dir, tmp_path, brightness_reward,
                                                        monkeypatch):
    """``model.compile`` compiles the transformer's forward through TorchDynamo (here with its
    eager backend, so the test does not wait for a C++ build): the hooks still count every call,
    the ratio is 1 before the update and the metrics equal the eager run's."""
    from flowgrpo.distributed import unwrap
    from flowgrpo.run.tracking import read_metrics

    compiled = []
    real = torch.compile

    def eager_backend(fn, mode=None):
        compiled.append(mode)
        return real(fn, backend="eager")

    rows = []
    for mode in ("", "default"):
        out = tmp_path / (mode or "eager")
        if mode:
            monkeypatch.setattr(torch, "compile", eager_backend)
        t = trainer_for(tiny_sd3_dir, out, brightness_reward, run={"epochs": 2, "save_every": 0},
                        model={"compile": mode})
        forward = unwrap(t.adapter.transformer).forward
        assert hasattr(forward, "_torchdynamo_orig_callable") == bool(mode)
        t.train()
        rows.append([{k: v for k, v in r.items() if not k.startswith("time/")}
                     for r in read_metrics(out)])
    assert compiled == ["default"]
    assert rows[0] == rows[1]
    assert rows[1][1]["train/ratio_max"] == 1.0 and rows[1][1]["calls/grad"] > 0


@pytest.mark.slow
def test_optimizer_kernel_is_fused_on_cuda_by_default_and_selectable(tiny_sd3_dir, tmp_path,
                                                                     brightness_reward):
    from flowgrpo.training.components import optimizer_kernel

    assert optimizer_kernel("auto", torch.device("cpu")) == {}
    assert optimizer_kernel("auto", torch.device("cuda", 0)) == {"fused": True}
    t = trainer_for(tiny_sd3_dir, tmp_path, brightness_reward,
                    train={"optimizer_kernel": "fused"})
    group = t.optimizer.param_groups[0]
    assert group["fused"] is True and not group["foreach"]
    before = [p.detach().clone() for p in t.params]
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    t.update(batch, adv, 0)
    assert any(not torch.equal(a, p) for a, p in zip(before, t.params))
