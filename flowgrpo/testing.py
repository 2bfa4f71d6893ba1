"""Checks a plug-in author runs on their own pieces: the contract every model family keeps.

A family is an adapter (``pipelines.FlowAdapter``) registered under a name. The trainer relies
on a handful of promises the adapter's methods must keep together; :func:`check_family_contract`
runs them all on a small pipeline saved in a folder, the same check the project's own families
pass::

    # tests/test_my_family.py of a plug-in
    from flowgrpo.testing import check_family_contract

    def test_my_family_keeps_the_contract(tmp_path):
        folder = tmp_path / "model"
        tiny_my_pipeline().save_pretrained(str(folder))  # random weights, a few layers
        check_family_contract("my_family", folder, {"height": 16, "width": 16}, tmp_path)

A broken promise raises ``AssertionError`` naming what failed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import samplers
from pipelines.base import FAMILIES
from reward_models import REWARDS, RewardOutput

__all__ = ["CONTRACT_SAMPLERS", "DISCRETE_CONTRACT_SAMPLERS", "check_family_contract"]

CONTRACT_SAMPLERS = [("sde", {}), ("cps", {}), ("langevin", {"velocity": "model"})]
"""The stochastic samplers (name, parameters) the contract rolls out a continuous family with."""

DISCRETE_CONTRACT_SAMPLERS = [("ctmc", {})]
"""The samplers a discrete (token) family is rolled out with, unless it names its own sampler
(``default_sampler``, e.g. ``vq_diffusion``): then that one."""

_REWARD = "contract_energy"


def _energy():
    """Mean of the media values: defined for images, video and audio alike."""
    return lambda media, prompts, metadata: RewardOutput(
        media.data.float().flatten(1).mean(1))


def _require(condition: bool, what: object) -> None:
    """``assert`` that survives ``python -O``: a plug-in may run the contract outside pytest."""
    if not condition:
        raise AssertionError(what)


def check_family_contract(family: str, folder: str | Path, options: dict | None = None,
                          output_dir: str | Path | None = None, *, prompts: str = "digits",
                          guidance: float = 1.0) -> None:
    """Check that family ``family`` trains with the unchanged trainer.

    Loaded from the pipeline folder ``folder`` with the adapter ``options``, with LoRA rank 4,
    groups of 2, batches of 4 and 3 steps, the family must:

    1. encode the prompt set ``prompts`` (a built-in name or a ``.jsonl`` path; edits carry
       their source images) and roll out with every sampler of :data:`CONTRACT_SAMPLERS`
       (a discrete family: :data:`DISCRETE_CONTRACT_SAMPLERS`, or its ``default_sampler``);
    2. decode to media of its modality (``[B, C, H, W]`` images, ``[B, F, C, H, W]`` video,
       ``[B, C, T]`` audio) that a reward scores with ``B`` finite scores;
    3. replay every trained step with the log-prob it recorded (ratio 1 within 1e-6 before any
       update): rollout and replay see the same model, noise and conditioning;
    4. take one training step that changes LoRA weights and nothing else (a frozen second
       expert included);
    5. save a checkpoint whose LoRA, loaded into a fresh pipeline the way ``flowgrpo sample``
       loads it, gives the trained velocity within 1e-5 at a high and a low noise level.

    The run folder is ``output_dir`` (a temporary folder when ``None``); the reward is the mean
    media value, registered as ``contract_energy`` for the duration of the check.

    Raises:
        AssertionError: the first promise the family breaks.
    """
    if output_dir is None:
        with tempfile.TemporaryDirectory(prefix="flowgrpo-contract-") as tmp:
            return check_family_contract(family, folder, options, tmp, prompts=prompts,
                                         guidance=guidance)
    from flowgrpo.cli.inference import load_trained
    from flowgrpo.config.io import from_dict
    from flowgrpo.rl.replay import replay_step
    from flowgrpo.training.trainer import Trainer

    with REWARDS.registered(_REWARD, _energy):
        cfg = from_dict({
            "model": {"family": family, "path": str(folder), "options": dict(options or {}),
                      "guidance": guidance, "lora_rank": 4, "lora_alpha": 4},
            "reward": {"name": _REWARD},
            "data": {"prompts": prompts, "eval_images_per_prompt": 1},
            "sampler": {"num_steps": 3},
            "train": {"group_size": 2, "batch_size": 4, "lr": 1e-2, "beta": 0.1},
            "run": {"epochs": 1, "output_dir": str(output_dir), "progress": False,
                    "tensorboard": False},
        })
        idx = torch.arange(4)
        adapter_cls = FAMILIES.get(family)
        space = getattr(adapter_cls, "state_space", samplers.CONTINUOUS)
        contract = CONTRACT_SAMPLERS if space is samplers.CONTINUOUS else DISCRETE_CONTRACT_SAMPLERS
        own = getattr(adapter_cls, "default_sampler", "ctmc")
        if space is not samplers.CONTINUOUS and own != "ctmc":
            contract = [(own, {})]  # a chain of its own (VQ-Diffusion's): the ctmc path is not it
        for name, params in contract:
            t = Trainer.from_config(cfg, sampler=samplers.build(name, **params))
            batch = t.sample(0)
            media = t.adapter.decode(batch.traj.final)
            _require(media.dim() == {"image": 4, "video": 5, "audio": 3}[t.adapter.modality],
                     f"{name}: decoded media of shape {tuple(media.shape)} for modality "
                     f"{t.adapter.modality}")
            _require(batch.reward.scores.shape == (4,)
                     and bool(torch.isfinite(batch.reward.scores).all()),
                     f"{name}: reward scores {batch.reward.scores}")
            for j in range(batch.traj.num_trained):
                logp = replay_step(t.adapter, t.sampler, batch.traj, idx, j, guidance).log_prob
                ratio = torch.exp(logp - batch.traj.log_probs[:, j])
                _require(torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0),
                         (name, ratio))
        # the trained transformer and any frozen one beside it (Wan2.2 A14B's other expert)
        models = [t.adapter.transformer, getattr(t.adapter, "frozen_expert", None)]

        def params() -> dict:
            return {f"{i}.{n}": p for i, m in enumerate(models) if m is not None
                    for n, p in m.named_parameters()}

        before = {n: p.detach().clone() for n, p in params().items()}
        adv, _ = t.advantages(batch)
        t.update(batch, adv, 0)
        after = params()
        changed = [n for n in before if not torch.equal(before[n], after[n].detach())]
        _require(changed and all("lora_" in n for n in changed), changed[:3])
        # the checkpoint's LoRA loads back into a fresh pipeline the way `flowgrpo sample`
        # loads it (at a high and a low noise level: both experts of a two-expert model)
        loaded = load_trained(t.cfg, str(t.save(1)))
        items = batch.prompts[:2], batch.metadata[:2]
        x = t.adapter.initial_noise([torch.Generator().manual_seed(i) for i in range(2)],
                                    t.adapter.encode_inputs(*items))
        for s in (0.95, 0.5):
            sigma = torch.full((2,), s)
            with torch.no_grad():
                ours = t.adapter.velocity(x, sigma, t.adapter.encode_inputs(*items), guidance)
                theirs = loaded.velocity(x, sigma, loaded.encode_inputs(*items), guidance)
            torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
