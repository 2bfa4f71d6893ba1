"""The trainer's side of rewards: build from config, run inline or in a worker pool, gather.

The trainer never looks at reward names: a mix of rewards is itself a reward whose output carries
per-component scores, which are logged as ``reward/<name>`` and, with the ``normalize_then_sum``
aggregation, normalized one by one before they are summed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from flowgrpo.config.schema import RewardConfig, RunConfig
from flowgrpo.errors import RunError, one_line
from flowgrpo.registry import short_name
from pipelines import FlowAdapter
from reward_models import Media, RewardOutput
from reward_models.checks import RewardFault, check_output


def _with_given(specs: list[dict], given: dict[str, Callable]) -> list[dict]:
    """``specs`` with each name in ``given`` replaced by its reward, built as the registry
    builds a plugged-in one, and keyed by the name's short form (the metrics' name)."""
    if not given:
        return specs
    from reward_models.base import as_reward_factory

    out = []
    for spec in specs:
        name = spec["name"]
        if name in given:
            spec = {**spec, "name": as_reward_factory(given[name])(**spec["params"]),
                    "params": {}, "key": short_name(name)}
        out.append(spec)
    if len(out) == 1 and out[0]["weight"] == 1.0:  # one reward alone is not a mix
        out[0].pop("key", None)
    return out


class _Done(Future):
    """An already finished future (inline rewards)."""

    def __init__(self, value: RewardOutput | None = None,
                 error: BaseException | None = None) -> None:
        super().__init__()
        if error is None:
            self.set_result(value)
        else:
            self.set_exception(error)


@dataclass
class Pending:
    """A chunk being scored: its future and what a retry needs."""

    future: Future
    media: Media
    prompts: list[str]
    metadata: list[dict]


class RewardStop(RunError):
    """A reward fault under the ``stop`` policy (or after the last retry)."""


class RewardRunner:
    """Scores decoded media with the configured reward, under the run's fault policies.

    Args:
        cfg: the ``reward`` config section.
        adapter: the model adapter (its modality and sample rate describe the media).
        run: the ``run`` config section (``on_reward_error``, ``reward_retries``,
            ``on_nonfinite``); None: stop on every fault.
        given: rewards the caller holds (scoring functions or reward classes, as the Python API
            takes them), by the name ``cfg`` records for them; the other names are looked up in
            the reward registry.
    """

    def __init__(self, cfg: RewardConfig, adapter: FlowAdapter, run: RunConfig | None = None,
                 given: dict[str, Callable] | None = None) -> None:
        from reward_models.mix import build_reward

        self.cfg = cfg
        self.run = run or RunConfig(on_reward_error="stop", on_nonfinite="stop")
        self.name = "+".join(spec["name"] for spec in cfg.specs())
        self.reward = build_reward(_with_given(cfg.specs(), given or {}), mode=cfg.mix_mode,
                                   seed=self.run.seed)
        self.modality = adapter.modality
        self.sample_rate = adapter.sample_rate
        self.groupwise = bool(getattr(self.reward, "groupwise", False))
        # a mix exposes its top-level component keys and weights (nested parts are only logged)
        keys, weights = getattr(self.reward, "keys", None), getattr(self.reward, "weights", None)
        self.weights = dict(zip(keys, weights)) if keys and weights else None
        self.pool = None
        if cfg.async_workers:
            from reward_models.async_pool import AsyncReward

            self.pool = AsyncReward(self.reward, workers=cfg.async_workers)

    def media(self, data: torch.Tensor) -> Media:
        return Media(self.modality, data, self.sample_rate)

    def submit(self, data: torch.Tensor, prompts: list[str], metadata: list[dict]) -> Pending:
        """Start scoring a chunk (see :meth:`collect`)."""
        media = self.media(data.detach())
        return Pending(self._start(media, prompts, metadata), media, prompts, metadata)

    def _start(self, media: Media, prompts: list[str], metadata: list[dict]) -> Future:
        if self.pool is not None:
            return self.pool.submit(media, prompts, metadata)
        try:
            return _Done(self.reward(media, prompts, metadata))
        except Exception as err:  # reported by collect, under the run's policy
            return _Done(error=err)

    def collect(self, pending: list[Pending], groups: torch.Tensor | None = None
                ) -> tuple[RewardOutput, torch.Tensor]:
        """Wait for every chunk and concatenate in order, applying the fault policies.

        Returns:
            the rewards and a ``[B]`` bool mask of the usable samples: under ``skip_group``, a
            failed chunk's samples and every sample of a group holding a NaN or inf score are
            unusable (their scores read 0).

        Raises:
            RewardStop: one line naming the reward and the fault, under ``stop`` (and after the
                last ``retry``).
        """
        outputs, bad = [], []
        for job in pending:
            out, mask = self._checked(job)
            outputs.append(out)
            bad.append(mask)
        out, unusable = RewardOutput.cat(_conform(outputs, bad)), torch.cat(bad)
        if groups is not None and bool(unusable.any()):  # a group is used whole or not at all
            unusable = torch.isin(groups.cpu(), groups.cpu()[unusable])
        if bool(unusable.any()):
            out = _zeroed(out, unusable)
        return out, ~unusable

    def _checked(self, job: Pending) -> tuple[RewardOutput, torch.Tensor]:
        """One chunk's checked output and its unusable samples."""
        n, policy = len(job.prompts), self.run.on_reward_error
        future = job.future
        for attempt in range(1 + (self.run.reward_retries if policy == "retry" else 0)):
            if attempt:
                future = self._start(job.media, job.prompts, job.metadata)
            out = None
            try:
                out = future.result()
                check_output(self.name, out, n)
                return out, torch.zeros(n, dtype=torch.bool)
            except RewardFault as fault:
                if fault.bad is not None and out is not None:  # NaN or inf: on_nonfinite
                    if self.run.on_nonfinite == "skip_group":
                        return out, fault.bad.cpu().bool()
                    raise RewardStop(f"{fault.message} (run.on_nonfinite: stop)") from None
                error = fault.message
            except Exception as err:  # noqa: BLE001 - a user's reward may raise anything
                error = f"reward {self.name} raised {one_line(err, with_type=True)}"
        if policy == "skip_group":
            return _zeros(n, self.weights), torch.ones(n, dtype=torch.bool)
        tries = f" after {attempt + 1} tries" if attempt else ""
        raise RewardStop(f"{error}{tries} (run.on_reward_error: {policy})")

    def score(self, data: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        """Score a batch synchronously (eval); a fault is a one-line
        :class:`~flowgrpo.errors.RunError` naming the reward (an eval has no policy to skip)."""
        try:
            return check_output(self.name, self.reward(self.media(data.detach()), prompts,
                                                       metadata), len(prompts))
        except RewardFault as fault:
            raise RunError(f"eval: {fault.message}") from None
        except Exception as err:  # noqa: BLE001 - a user's reward may raise anything
            raise RunError(f"eval: reward {self.name} raised "
                           f"{one_line(err, with_type=True)}") from None

    def for_advantages(self, signal) -> torch.Tensor | dict:
        """What the advantage estimator normalises (``signal``: a credit's
        :class:`~flowgrpo.rl.credit.Signal`): the scores, or the components when each reward is
        normalized on its own (``normalize_then_sum``)."""
        if self.cfg.aggregation == "normalize_then_sum" and self.weights and signal.components:
            return {k: signal.components[k] for k in self.weights}
        return signal.scores

    def metrics(self, scores: torch.Tensor, components: dict[str, torch.Tensor],
                info: dict[str, float], usable: torch.Tensor, prefix: str = "reward") -> dict:
        """``reward/mean``, ``reward/std`` and ``reward/<component>`` over the usable samples
        (``usable``) of the ``scores`` and ``components`` of every process;
        ``reward/skipped_samples`` when some were skipped; ``info``, this process's reward info,
        as it is."""
        usable = usable.bool()
        scores = scores.float()[usable]
        metrics = {f"{prefix}/mean": scores.mean().item(), f"{prefix}/std": scores.std().item()}
        for key, value in components.items():
            metrics[f"{prefix}/{key}"] = value.float()[usable].mean().item()
        if not bool(usable.all()):
            metrics[f"{prefix}/skipped_samples"] = float((~usable).sum())
        for key, value in info.items():
            metrics[f"{prefix}/{key}"] = float(value)
        return metrics


def _zeros(n: int, keys: dict | None) -> RewardOutput:
    """The stand-in output of a skipped chunk."""
    components = {k: torch.zeros(n) for k in keys} if keys else None
    return RewardOutput(torch.zeros(n), None, components, {})


def _zeroed(out: RewardOutput, unusable: torch.Tensor) -> RewardOutput:
    """``out`` with the unusable samples' scores set to 0 (they are never trained on)."""
    def clean(value: torch.Tensor) -> torch.Tensor:
        mask = unusable.reshape(-1, *([1] * (value.ndim - 1)))
        return torch.where(mask, torch.zeros((), dtype=value.dtype), value)

    components = {k: clean(v) for k, v in out.components.items()} if out.components else None
    regions = None if out.regions is None else clean(out.regions)
    return RewardOutput(clean(out.scores), regions, components, out.info)


def _conform(outputs: list[RewardOutput], bad: list[torch.Tensor]) -> list[RewardOutput]:
    """Give a skipped chunk's stand-in the regions and info keys of a scored chunk, so the
    chunks concatenate."""
    good = next((o for o, b in zip(outputs, bad) if not bool(b.all())), None)
    if good is None:
        return outputs
    out = []
    for o, b in zip(outputs, bad):
        if bool(b.all()) and o is not good:
            regions = (None if good.regions is None else
                       torch.zeros(len(o.scores), *good.regions.shape[1:]))
            o = RewardOutput(o.scores, regions, o.components, {k: 0.0 for k in good.info})
        out.append(o)
    return out
