"""Inference helpers behind ``flowgrpo sample`` and ``flowgrpo eval``.

A trained run is the base pipeline plus ``<checkpoint>/lora`` loaded by the adapter's
``load_lora`` into the transformer it trained (the same folder loads with diffusers'
``pipeline.load_lora_weights``; families whose pipeline has no LoRA loader read the peft folder
their ``save_lora`` wrote), or the fully fine-tuned ``transformer/``.
"""

from __future__ import annotations

from pathlib import Path

import torch

import samplers
from flowgrpo import console
from flowgrpo.config.io import load_config
from flowgrpo.config.schema import Config
from flowgrpo.data.prompts import load_prompts
from flowgrpo.errors import ConfigError
from flowgrpo.rl.session import ModelSession
from flowgrpo.seeding import stream_seed
from flowgrpo.training.evaluation import Evaluator, generate
from flowgrpo.training.model_setup import load_adapter
from flowgrpo.training.reward_runner import RewardRunner


def run_config(run: str, overrides: list[str] | None = None) -> Config:
    """The resolved config saved with a run (``run`` may be a checkpoint folder), with
    ``--set`` ``overrides`` applied."""
    path = Path(run)
    for folder in (path, path.parent.parent):
        if (folder / "config.yaml").is_file():
            return load_config(folder / "config.yaml", overrides)
    raise FileNotFoundError(f"no config.yaml found for {run}")


def load_trained(cfg: Config, run: str | None, device: str | torch.device = "cpu"):
    """The base adapter of ``cfg``, with the trained weights of ``run`` when given."""
    from flowgrpo.run.checkpoint import find_checkpoint

    adapter = load_adapter(cfg.model, device)
    if run:
        folder = find_checkpoint(run, "")
        if (folder / "lora").is_dir():
            adapter.load_lora(str(folder / "lora"))
        else:
            from safetensors.torch import load_file

            state = load_file(str(folder / "trainable.safetensors"))
            adapter.transformer.load_state_dict(state, strict=False)
    return adapter


def _device(cfg: Config) -> str:
    return "cuda" if torch.cuda.is_available() and not cfg.run.cpu else "cpu"


def sample(cfg: Config | None, run: str | None, prompts: list[str] | None, sampler: str | None,
           num_steps: int | None, seed: int, num: int, out: str,
           params_given: bool = False) -> Path:
    """Write a grid of ``num`` samples per prompt to ``out`` and return its path (``sampler``
    None: the ODE, or the config's sampler for a discrete model, which has no ODE).
    ``params_given``: the user set ``sampler.params``, which must then reach the sampler used
    (the config's), else this is a :class:`ConfigError` rather than params ignored."""
    cfg = cfg if cfg is not None else run_config(run)
    adapter = load_trained(cfg, run, _device(cfg))
    if sampler is None:
        sampler = "ode" if adapter.state_space.deterministic_eval else cfg.sampler.name
    if params_given and sampler != cfg.sampler.name:
        raise ConfigError(f"sampler.params are the params of {cfg.sampler.name!r}, but sample "
                          f"uses {sampler!r}: pass --sampler {cfg.sampler.name} to use them")
    items = ([(p, {}) for p in prompts] if prompts
             else load_prompts(cfg.data.eval_prompts or cfg.data.prompts))
    all_prompts = [p for p, _ in items for _ in range(num)]
    all_metadata = [m for _, m in items for _ in range(num)]
    seeds = [stream_seed("sample_noise", seed, i) for i in range(len(all_prompts))]
    media = generate(adapter, adapter.encode_inputs, all_prompts, seeds,
                     num_steps or cfg.sampler.eval_num_steps or cfg.sampler.num_steps,
                     cfg.model.guidance, cfg.train.sample_batch_size or cfg.train.batch_size,
                     sampler=samplers.build(sampler, **(cfg.sampler.params
                                                      if sampler == cfg.sampler.name else {})),
                     metadata=all_metadata)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if adapter.modality == "audio":
        from pipelines.media_io import save_wav

        path.mkdir(exist_ok=True)
        for i, clip in enumerate(media):
            save_wav(clip, adapter.sample_rate, path / f"sample_{i}.wav")
    else:
        from torchvision.utils import save_image

        images = media[:, 0] if adapter.modality == "video" else media
        save_image(images.float().cpu(), path, nrow=num, padding=1)
    console.note(f"wrote {len(all_prompts)} samples to {path}")
    return path


def evaluate(cfg: Config | None, run: str | None) -> dict:
    """Eval reward (fixed prompts and seeds, Euler sampler) of the base model or a run."""
    from accelerate import Accelerator

    cfg = cfg if cfg is not None else run_config(run)
    acc = Accelerator(cpu=cfg.run.cpu or not torch.cuda.is_available())
    adapter = load_trained(cfg, run, acc.device)
    rewards = RewardRunner(cfg.reward, adapter)
    prompts = load_prompts(cfg.data.eval_prompts or cfg.data.prompts)
    # full precision and one encoder call per chunk, as the CLI's eval has always run
    session = ModelSession(adapter, acc.device, guidance=cfg.model.guidance)
    return Evaluator(cfg, session, rewards, prompts, acc, encode=adapter.encode_inputs).run(0)
