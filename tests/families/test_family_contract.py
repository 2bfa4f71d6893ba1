"""The contract every registered family passes with the unchanged trainer: load from a folder,
encode, roll out with each stochastic sampler (ratio 1 before any update), decode, reward, one
LoRA training step that changes only the LoRA weights, and a checkpoint whose LoRA loads back
into a fresh pipeline."""

from __future__ import annotations

import pytest
import torch

import pipelines
import samplers
from flowgrpo.config.io import from_dict
from flowgrpo.rl.replay import replay_step
from reward_models import REWARDS, RewardOutput

try:
    from tests.test_families import CASES
except ImportError:  # tests/ itself is on sys.path (pytest's default import mode)
    from test_families import CASES

SAMPLERS = [("sde", {}), ("cps", {}), ("langevin", {"velocity": "model"})]


def energy():
    """Mean of the media values: defined for images, video and audio alike."""
    return lambda media, prompts, metadata: RewardOutput(
        media.data.float().flatten(1).mean(1))


# Optional extras run the same contract in their own test file, which skips without the extra.
# A family whose tiny pipeline does not fit the shared parity tests runs the contract there too.
OWN_CONTRACT = {"f5_tts": "tests/test_f5_tts.py::test_family_contract",
                "flux2_klein": "tests/test_families_editing.py::test_family_contract"}


def test_every_registered_family_has_a_contract_case():
    missing = set(pipelines.names()) - set(CASES) - set(OWN_CONTRACT)
    assert not missing, missing


def check_family_contract(family: str, folder, options: dict, tmp_path,
                          prompts: str = "digits", guidance: float = 1.0) -> None:
    """The contract for the family ``family`` loaded from the pipeline folder ``folder`` with
    ``options``, trained on the prompt set ``prompts`` (a name or a .jsonl path)."""
    from flowgrpo.cli.inference import load_trained
    from flowgrpo.training.trainer import Trainer

    REWARDS.register("energy_test")(energy)
    try:
        cfg = from_dict({
            "model": {"family": family, "path": str(folder), "options": dict(options),
                      "guidance": guidance, "lora_rank": 4, "lora_alpha": 4},
            "reward": {"name": "energy_test"},
            "data": {"prompts": prompts, "eval_images_per_prompt": 1},
            "sampler": {"num_steps": 3},
            "train": {"group_size": 2, "batch_size": 4, "lr": 1e-2, "beta": 0.1},
            "run": {"epochs": 1, "output_dir": str(tmp_path), "progress": False,
                    "tensorboard": False},
        })
        t = Trainer(cfg)
        idx = torch.arange(4)
        for name, params in SAMPLERS:
            t.use_sampler(samplers.get(name, **params))
            batch = t.sample(0)
            media = t.adapter.decode(batch.traj.final)
            assert media.dim() == {"image": 4, "video": 5, "audio": 3}[t.adapter.modality]
            assert batch.reward.scores.shape == (4,) and torch.isfinite(batch.reward.scores).all()
            for j in range(batch.traj.num_trained):
                logp = replay_step(t.adapter, t.sampler, batch.traj, idx, j, guidance).log_prob
                ratio = torch.exp(logp - batch.traj.log_probs[:, j])
                assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0), (
                    name, ratio)
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
        assert changed and all("lora_" in n for n in changed), changed[:3]
        # the checkpoint's LoRA loads back into a fresh pipeline the way `flowgrpo sample`
        # loads it (at a high and a low noise level: both experts of a two-expert model)
        loaded = load_trained(t.cfg, str(t.save(1)))
        x = t.adapter.noise(2, torch.Generator().manual_seed(0))
        items = batch.prompts[:2], batch.metadata[:2]
        for s in (0.95, 0.5):
            sigma = torch.full((2,), s)
            with torch.no_grad():
                ours = t.adapter.velocity(x, sigma, t.adapter.encode_inputs(*items), guidance)
                theirs = loaded.velocity(x, sigma, loaded.encode_inputs(*items), guidance)
            torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    finally:
        REWARDS._items.pop("energy_test")


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CASES))
def test_family_contract(family, tmp_path):
    case = CASES[family]
    folder = tmp_path / "model"
    case.make().pipeline.save_pretrained(str(folder))
    check_family_contract(family, folder, case.options, tmp_path)
