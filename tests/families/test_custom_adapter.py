"""Adding a modality is one adapter: a per-position flow model defined here trains with the
unchanged trainer, and region rewards move the log-prob only where the regions differ."""

from __future__ import annotations

import pytest
import torch

import pipelines
import samplers
from flowgrpo.config.io import from_dict
from pipelines import Cond, FlowAdapter
from reward_models import REWARDS, RewardOutput
from reward_models.media import require


class PerPosition(torch.nn.Module):
    """``v = a * x + b`` with its own ``(a, b)`` at every latent position."""

    def __init__(self, side: int = 4) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.ones(1, 1, side, side))
        self.b = torch.nn.Parameter(torch.zeros(1, 1, side, side))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * x + self.b


class PointwiseAdapter(FlowAdapter):
    """A tiny image "model": 1x4x4 latents, decoded as sigmoid(x) in 3 channels."""

    def __init__(self, path_or_id: str, side: int = 4, **_: object) -> None:
        self.transformer = PerPosition(side)
        self.pipeline = None
        self.side = side

    def to(self, device):
        self.transformer.to(device)
        return self

    def encode(self, prompts: list[str]) -> Cond:
        return Cond({"ids": torch.zeros(len(prompts), 1)})

    def noise(self, n, generator=None):
        return torch.randn(n, 1, self.side, self.side, generator=generator)

    def schedule(self, num_steps):
        return torch.linspace(1, 0, num_steps + 1)

    def velocity(self, x, sigma, cond, guidance):
        return self.transformer(x)

    def decode(self, x):
        return torch.sigmoid(x).expand(-1, 3, -1, -1)


def quadrant_reward():
    """Whole-image brightness; region scores differ between samples only in the top-left."""

    def reward(media, prompts, metadata):
        require(media, "image", reward="quadrant_test")
        img = media.data.mean(1)
        regions = torch.full_like(img, 0.5)
        regions[:, :2, :2] = img[:, :2, :2]
        return RewardOutput(img.mean(dim=(1, 2)), regions=regions)

    return reward


def brightness():
    return lambda media, prompts, metadata: RewardOutput(media.data.mean(dim=(1, 2, 3)))


@pytest.fixture(scope="module", autouse=True)
def plugged():
    """The test family and rewards, registered for this module's tests only."""
    with (pipelines.FAMILIES.registered("pointwise_test", PointwiseAdapter),
          REWARDS.registered("quadrant_test", quadrant_reward),
          REWARDS.registered("bright_test", brightness)):
        yield


def config(tmp_path, reward, **train):
    return from_dict({
        "model": {"family": "pointwise_test", "path": "none", "lora": False},
        "reward": {"name": reward},
        "sampler": {"num_steps": 4},
        "train": {"group_size": 8, "batch_size": 32, "lr": 3e-2, "weight_decay": 0.0, **train},
        "run": {"epochs": 25, "eval_every": 25, "save_every": 0, "output_dir": str(tmp_path),
                "progress": False, "tensorboard": False},
    })


def test_custom_adapter_trains_with_the_unchanged_trainer(tmp_path):
    from flowgrpo.run.tracking import read_metrics
    from flowgrpo.training.trainer import Trainer

    Trainer.from_config(config(tmp_path, "bright_test")).train()
    rows = read_metrics(tmp_path)
    base, last = rows[0]["eval/reward"], rows[-1]["eval/reward"]
    assert last > base + 0.05, (base, last)


def test_region_reward_moves_log_prob_only_in_its_region(tmp_path):
    from flowgrpo.training.trainer import Trainer

    t = Trainer.from_config(config(tmp_path, "quadrant_test", max_grad_norm=0.0))
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    assert adv.shape == (32, 1, 1, 16)  # one advantage per region cell
    assert batch.regions.shape == (16, 1, 4, 4)  # each cell's map on the latent grid
    pos = adv.reshape(32, 4, 4)
    outside = torch.ones(4, 4, dtype=torch.bool)
    outside[:2, :2] = False
    assert torch.all(pos[:, outside] == 0)
    inside = pos[:, :2, :2]
    assert (inside < 0).any() and (inside > 0).any()

    def element_log_probs():
        traj, k = batch.traj, int(batch.traj.trained[0, 0])
        x, x_next = traj.latents[:, k].float(), traj.latents[:, k + 1].float()
        with torch.no_grad():
            v = t.adapter.velocity(x, traj.sigmas[k], traj.cond, 1.0)
            tr = t.sampler.transition(v, x, float(traj.sigmas[k]), float(traj.sigmas[k + 1]))
        return -((x_next - tr.mean) ** 2) / (2 * tr.std**2)

    before = element_log_probs()
    t.update(batch, adv, 0)
    delta = (element_log_probs() - before).abs()[:, 0]
    assert delta[:, :2, :2].max() > 1e-6
    assert delta[:, outside].max() == 0


def test_pointwise_adapter_is_a_registered_family():
    assert "pointwise_test" in pipelines.names()
    assert samplers.get("sde").is_stochastic


class SourceImageAdapter(PointwiseAdapter):
    """An image-conditioned family: a sample's velocity is shifted by the mean of its source
    image (metadata ``"image"``), read in ``encode_inputs``."""

    condition_keys = ("image",)
    reads: list = []

    def encode_inputs(self, prompts, metadata=None):
        import numpy as np
        from PIL import Image

        metadata = metadata or [{} for _ in prompts]
        shifts = []
        for meta in metadata:
            type(self).reads.append(meta.get("image"))
            pixels = np.asarray(Image.open(meta["image"]).convert("L"), dtype=np.float32)
            shifts.append(torch.tensor(pixels.mean() / 255))
        return Cond({"shift": torch.stack(shifts)[:, None, None, None]})

    def velocity(self, x, sigma, cond, guidance):
        return self.transformer(x) + cond.tensors["shift"]


def test_an_image_conditioned_family_encodes_each_prompt_with_its_own_source(tmp_path):
    """Prompt sets give source images by paths relative to the .jsonl; the trainer encodes each
    distinct (prompt, image) once, caches it across epochs, and eval passes the metadata too."""
    from PIL import Image

    from flowgrpo.data.prompts import load_prompts
    from flowgrpo.training.trainer import Trainer

    (tmp_path / "src").mkdir()
    for name, value in (("dark.png", 0), ("light.png", 255)):
        Image.new("L", (4, 4), value).save(tmp_path / "src" / name)
    rows = tmp_path / "edits.jsonl"
    rows.write_text('{"prompt": "make it red", "image": "src/dark.png"}\n'
                    '{"prompt": "make it red", "image": "src/light.png"}\n')
    items = load_prompts(str(rows))
    assert [m["image"] for _, m in items] == [str((tmp_path / "src" / n).resolve())
                                              for n in ("dark.png", "light.png")]
    with pipelines.FAMILIES.registered("source_image_test", SourceImageAdapter):
        cfg = config(tmp_path / "run", "bright_test")
        cfg.data.prompts, cfg.model.family = str(rows), "source_image_test"
        cfg.train.batch_size, cfg.train.group_size = 4, 2
        t = Trainer.from_config(cfg)
        SourceImageAdapter.reads.clear()
        cond = t.session.encode(["make it red"] * 4, [items[0][1], items[1][1]] * 2)
        assert cond.tensors["shift"].flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
        assert len(SourceImageAdapter.reads) == 2  # one encoding per distinct (prompt, image)
        t.session.encode(["make it red"] * 2, [items[1][1], items[0][1]])
        assert len(SourceImageAdapter.reads) == 2  # cached across calls
        SourceImageAdapter.reads.clear()
        t.session._cond_cache.clear()
        t.evaluator.run(0)
        assert set(SourceImageAdapter.reads) == {m["image"] for _, m in items}


def test_a_missing_source_image_names_its_line(tmp_path):
    import pytest

    from flowgrpo.data.prompts import load_prompts
    from flowgrpo.errors import ConfigError

    rows = tmp_path / "edits.jsonl"
    rows.write_text('{"prompt": "a", "image": "missing.png"}\n')
    with pytest.raises(ConfigError, match=r"edits.jsonl:1: 'image' file 'missing.png' not found"):
        load_prompts(str(rows), "data.prompts")
    rows.write_text('{"prompt": "a"}\n{"prompt": "b", "mask": 3}\n')
    with pytest.raises(ConfigError, match=r"edits.jsonl:2: 'mask' must be a file path"):
        load_prompts(str(rows), "data.prompts")


def test_a_batch_mixing_edits_and_text_to_image_is_a_one_line_error():
    import pytest

    from pipelines import Cond

    edit = Cond({"prompt_embeds": torch.zeros(1, 2), "image_latents": torch.zeros(1, 3)})
    plain = Cond({"prompt_embeds": torch.zeros(1, 2)})
    with pytest.raises(ValueError, match="mixes samples with and without a source") as err:
        Cond.cat([edit, plain])
    assert "\n" not in str(err.value)
