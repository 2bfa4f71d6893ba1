"""The Python API: a config from YAML or keywords, rewards as plain callables, train, read the run.

::

    import flowgrpo

    def brightness(media, prompts, metadata):        # one score per sample
        return media.data.mean(dim=(1, 2, 3))

    config = flowgrpo.load_config("configs/digits.yaml", run={"epochs": 5})
    run = flowgrpo.train(config, reward_funcs=brightness)
    print(run.evals[-1]["eval/reward"], run.last_checkpoint)

:func:`train` runs the same :class:`~flowgrpo.training.trainer.Trainer` as ``flowgrpo train``;
reward callables go straight to it, and the run's ``config.yaml`` records each under its
``module:qualified name`` (:func:`flowgrpo.registry.python_name`), so a run whose rewards can be
imported by that name also resumes from the command line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from flowgrpo.config.io import from_dict, layer, load_config, read_config, to_dict
from flowgrpo.config.schema import Config, RewardConfig
from flowgrpo.errors import ConfigError
from flowgrpo.registry import python_name

__all__ = ["Run", "load_config", "train"]

RewardArg = Callable[..., Any] | Sequence[Callable[..., Any] | tuple[Callable[..., Any], float]]


def train(config: Config | str | Path | None = None, *,
          reward_funcs: RewardArg | None = None,
          resume: str | None = None, overwrite: bool = False, **sections: dict) -> Run:
    """Train and return the :class:`Run`.

    Args:
        config: a :class:`Config`, a YAML path (a shipped recipe also by name) or ``None`` (the
            CPU default).
        reward_funcs: replaces the config's reward: a scoring function
            ``fn(media, prompts, metadata)`` returning one score per sample (or a
            :class:`~reward_models.RewardOutput`), a reward class, or a list of them, each
            optionally as ``(callable, weight)`` (a weighted mix, ``reward.mix_mode`` combining
            them).
        resume: ``"auto"`` or a run / checkpoint folder to continue (as ``--resume``).
        overwrite: start afresh in a run folder that holds a run (as ``--overwrite``).
        sections: keyword overrides per section, e.g. ``run={"epochs": 5}`` (``reward={...}``
            sets the reward section by name and params, as YAML does).
    """
    from flowgrpo.training.trainer import Trainer

    if isinstance(config, Config):
        config = from_dict(layer(to_dict(config), sections)) if sections else config
    else:
        config = load_config(config, **sections)
    given = None
    if reward_funcs is not None:
        given = named_rewards(reward_funcs)
        config = with_reward(config, reward_funcs)
    trainer = Trainer.from_config(config, resume=resume, overwrite=overwrite,
                                  reward_funcs=given)
    trainer.train()
    return Run(trainer.run_dir)


def named_rewards(reward: RewardArg) -> dict[str, Callable[..., Any]]:
    """Each reward callable of ``reward`` (see :func:`train`) by the name a config records for
    it (:func:`flowgrpo.registry.python_name`)."""
    return {python_name(fn): fn for fn, _ in _reward_items(reward)}


def with_reward(config: Config, reward: RewardArg) -> Config:
    """A copy of ``config`` whose reward is ``reward`` (see :func:`train`), each callable named
    by :func:`flowgrpo.registry.python_name`; the reward registry is left as it is, so the
    callables reach the run through :func:`named_rewards`."""
    specs = [{"name": python_name(fn), "weight": weight, "params": {}}
             for fn, weight in _reward_items(reward)]
    if len(specs) == 1 and specs[0]["weight"] == 1.0:
        section = dataclasses.replace(config.reward, name=specs[0]["name"], params={},
                                      components=[])
    else:
        section = dataclasses.replace(config.reward, components=specs, params={},
                                      name=RewardConfig.name)
    return dataclasses.replace(config, reward=section)


def _reward_items(reward: RewardArg) -> list[tuple[Callable[..., Any], float]]:
    """``(callable, weight)`` of each reward of ``reward`` (see :func:`train`)."""
    items = [reward] if callable(reward) else list(reward)
    if not items:
        raise ConfigError("reward: an empty list; pass a callable or a list of them")
    out = []
    for item in items:
        fn, weight = item if isinstance(item, tuple) else (item, 1.0)
        if not callable(fn):
            raise ConfigError(f"reward: expected a callable or (callable, weight), got {item!r}")
        weight = float(weight)
        if not math.isfinite(weight):
            raise ConfigError(f"reward: the weight of {python_name(fn)} is {weight}; it must be "
                              "a finite number")
        out.append((fn, weight))
    return out


@dataclasses.dataclass
class Run:
    """A run folder, read back (``flowgrpo train``'s output or :func:`train`'s).

    Attributes:
        path: the run folder.
    """

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not (self.path / "config.yaml").is_file():
            raise FileNotFoundError(f"{self.path} is not a run folder (no config.yaml)")

    @property
    def config(self) -> dict:
        """The resolved config the run saved, as a dict."""
        return yaml.safe_load((self.path / "config.yaml").read_text())

    @property
    def metrics(self) -> list[dict]:
        """Every row of ``metrics.jsonl``: one per epoch (``step``, ``reward/mean``, ``kl``, ...),
        eval rows included."""
        from flowgrpo.run.tracking import read_metrics

        return read_metrics(self.path) if (self.path / "metrics.jsonl").is_file() else []

    @property
    def evals(self) -> list[dict]:
        """The rows holding eval metrics (``eval/reward``, ...), the base model's (step 0)
        first."""
        return [row for row in self.metrics if any(k.startswith("eval/") for k in row)]

    @property
    def checkpoints(self) -> list[Path]:
        """The checkpoint folders, oldest first."""
        from flowgrpo.run.checkpoint import checkpoint_dirs

        return checkpoint_dirs(self.path)

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint folder (``None`` before the first save)."""
        found = self.checkpoints
        return found[-1] if found else None

    @property
    def samples(self) -> list[Path]:
        """The eval media the run wrote (``samples/``), in name order."""
        folder = self.path / "samples"
        return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []

    def load(self, device: str = "cpu") -> Any:
        """The trained model: the base pipeline's adapter with the last checkpoint's LoRA (or
        fine-tuned weights); ``.pipeline`` is the diffusers pipeline."""
        from flowgrpo.cli.inference import load_trained

        # the model needs no reward, and the callables a Python run was given need not import
        data = read_config(self.path / "config.yaml")
        data.pop("reward", None)
        return load_trained(from_dict(data), str(self.path), device)
