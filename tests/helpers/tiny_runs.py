"""Configs of short runs on the tiny SD3 pipeline (the ``tiny_sd3_dir`` fixture) and the
test-only ``brightness_test`` reward they train on."""

from __future__ import annotations


def register_brightness() -> str:
    """Register ``brightness_test``: the mean pixel value of images (frames averaged)."""
    from reward_models import RewardOutput, register
    from reward_models.media import as_frames, average_frames

    def factory():
        def reward(media, prompts, metadata):
            frames, per = as_frames(media)
            return RewardOutput(average_frames(frames.mean(dim=(1, 2, 3)), per))

        return reward

    register("brightness_test")(factory)
    return "brightness_test"


def write_tiny_config(folder, model_dir: str, reward: str, **run) -> str:
    """A YAML config of a tiny run in ``folder`` (LoRA rank 4, groups of 4, 8 samples, 4 steps,
    one eval image per prompt, no progress bar, run folder ``folder/run``); ``run`` overrides
    the run section. Returns its path."""
    import yaml

    cfg = {
        "model": {"path": model_dir, "lora_rank": 4, "lora_alpha": 4},
        "reward": {"name": reward},
        "data": {"eval_images_per_prompt": 1},
        "train": {"group_size": 4, "batch_size": 8},
        "sampler": {"num_steps": 4},
        "run": {"epochs": 2, "progress": False, "output_dir": str(folder / "run"), **run},
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def make_config(path, out, reward_name, **sections):
    """The config of a tiny run on the pipeline folder ``path`` into ``out`` (digit prompts,
    LoRA rank 4, groups of 4, 8 samples, 4 steps, 2 epochs with an eval and a checkpoint each);
    ``sections`` update the config's sections."""
    from flowgrpo.config.io import from_dict

    data = {
        "model": {"path": path, "lora_rank": 4, "lora_alpha": 4},
        "reward": {"name": reward_name},
        "data": {"prompts": "digits", "eval_images_per_prompt": 2},
        "train": {"group_size": 4, "batch_size": 8, "lr": 1e-3},
        "sampler": {"num_steps": 4},
        "run": {"epochs": 2, "eval_every": 1, "save_every": 1, "output_dir": str(out),
                "progress": False, "tensorboard": False},
    }
    for key, value in sections.items():
        data[key].update(value)
    return from_dict(data)
