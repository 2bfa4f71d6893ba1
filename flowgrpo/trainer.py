"""One GRPO trainer for every pipeline family, sampler, objective, credit scheme and reward.

Each epoch reads top to bottom: (1) draw prompt groups and the steps each sample trains (step
selection), (2) roll out with the configured sampler while rewards run (inline or in a worker
pool), (3) add views (MV-GRPO; none by default), (4) turn rewards into per-view, per-step,
per-region rewards (credit), gather them across processes and normalise them within groups,
(5) run the objective for ``num_inner_epochs`` passes of one generic update loop, (6) log model
calls, evaluate and checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

import samplers

from . import advantages as adv_lib
from . import checkpoint as ckpt
from . import credit as credit_lib
from . import objectives, pruning
from . import steps as steps_lib
from .batch import RolloutBatch, chunks
from .calls import CallCounter
from .config import Config
from .config_io import to_dict, to_yaml
from .data import load_prompts, sample_groups
from .ema import EMA
from .evaluate import Evaluator
from .model import load_adapter, make_trainable
from .rewards import RewardRunner
from .rollout import RolloutSpec, rollout
from .tracking import Tracker, new_run_dir
from .views import Views


class Trainer:
    """Build everything a run needs from a validated :class:`Config`.

    Args:
        config: the resolved configuration.
        resume: ``None`` (fresh run), ``"auto"`` (latest checkpoint of ``run.output_dir``, or of
            the newest run under ``runs/``) or a checkpoint / run folder.
    """

    def __init__(self, config: Config, resume: str | None = None) -> None:
        from accelerate import Accelerator
        from accelerate.utils import broadcast_object_list, set_seed

        self.cfg = cfg = config
        self.acc = Accelerator(cpu=cfg.run.cpu or not torch.cuda.is_available())
        checkpoint = ckpt.find_checkpoint(resume, cfg.run.output_dir) if resume else None
        if checkpoint is not None:
            run_dir = checkpoint.parent.parent
        else:
            run_dir = Path(cfg.run.output_dir) if cfg.run.output_dir else new_run_dir()
        self.run_dir = Path(broadcast_object_list([str(run_dir)])[0])
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        set_seed(cfg.run.seed + self.rank)

        self.adapter = load_adapter(cfg.model, self.acc.device)
        self.params = make_trainable(cfg.model, self.adapter)
        reference_copy = getattr(self.adapter, "reference_copy", None)  # full fine-tuning only
        self.calls = CallCounter([m for m in (self.adapter.transformer, reference_copy)
                                  if m is not None])
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.train.lr, betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
            weight_decay=cfg.train.weight_decay,
        )
        self.adapter.transformer, self.optimizer = self.acc.prepare(
            self.adapter.transformer, self.optimizer
        )
        self.ema = EMA(self.params, cfg.train.ema_decay) if cfg.train.ema else None
        self.sampler = samplers.get(cfg.sampler.name, **cfg.sampler.params)
        tc = cfg.train
        self.selection = steps_lib.build(tc.step_selection, seed=cfg.run.seed,
                                         **tc.step_selection_params)
        self.credit = credit_lib.build(tc.credit, **tc.credit_params)
        self.views = Views(tc.views, tc.enhancer, tc.enhancer_params, cfg.run.seed)
        self.rewards = RewardRunner(cfg.reward, self.adapter)
        self.prompts = load_prompts(cfg.data.prompts)
        self.autocast = autocast_factory(cfg.model.mixed_precision, self.acc.device)
        self.spec = RolloutSpec(self.sampler, cfg.model.guidance, cfg.sampler.after_window,
                                cfg.sampler.flash_ratio, getattr(torch, cfg.sampler.storage_dtype),
                                self.autocast)
        policy = objectives.Policy(
            self.adapter, self.sampler, guidance=cfg.model.guidance, loss=tc.loss,
            loss_params=tc.loss_params, beta=tc.beta,
            batch_size=tc.train_batch_size or tc.batch_size, autocast=self.autocast, kl=tc.kl,
            params=self.params, seed=cfg.run.seed)
        self.objective = objectives.build(tc.objective, policy, **tc.objective_params)
        self.pruner = pruning.build(tc.pruner, **tc.pruner_params)
        self.adv_state: dict = {}  # a stateful advantage estimator's running statistics
        self._cond_cache: dict[str, object] = {}
        self.start_epoch = 0
        if self.acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        self.acc.wait_for_everyone()
        self.tracker = Tracker(
            self.run_dir, self.acc.is_main_process, cfg.run.tensorboard,
            cfg.run.wandb_project if cfg.run.wandb else None, to_dict(cfg),
        )
        self.evaluator = Evaluator(
            cfg, self.adapter, self.rewards,
            load_prompts(cfg.data.eval_prompts or cfg.data.prompts), self.encode, self.acc,
            self.autocast, self.tracker, self.ema,
        )
        if checkpoint is not None:
            self.load(checkpoint)

    def use_sampler(self, sampler: samplers.Sampler) -> None:
        """Roll out and train with ``sampler`` from now on."""
        self.sampler = self.spec.sampler = self.objective.policy.sampler = sampler

    # ----------------------------------------------------------------- phases of an epoch
    def encode(self, prompts: list[str], cache: bool = True):
        """Encode each distinct prompt once and expand to the batch; encodings are cached across
        epochs when the family allows it (``per_prompt_encoding``), the config asks for it and
        ``cache`` is True (generated captions pass False)."""
        from pipelines import Cond

        if not self.adapter.per_prompt_encoding:  # one call, so every row shares its padding
            unique = sorted(set(prompts))
            with self.offloaded(self.adapter.text_encoder_names):
                enc = self.adapter.encode(unique)
            return enc.index([unique.index(p) for p in prompts])
        todo = sorted({p for p in prompts if p not in self._cond_cache})
        if todo:
            with self.offloaded(self.adapter.text_encoder_names):
                enc = self.adapter.encode(todo)
            for i, p in enumerate(todo):
                self._cond_cache[p] = enc.index(slice(i, i + 1))
        cond = Cond.cat([self._cond_cache[p] for p in prompts])
        if not (self.cfg.model.cache_prompt_embeds and cache):
            self._cond_cache.clear()
        return cond

    @contextmanager
    def offloaded(self, names: tuple[str, ...]) -> Iterator[None]:
        """With ``model.offload_encoders``, the named components sit on the accelerator only
        inside the block and wait on the CPU otherwise."""
        if not self.cfg.model.offload_encoders:
            yield
            return
        self.adapter.move_components(names, self.acc.device)
        try:
            yield
        finally:
            self.adapter.move_components(names, "cpu")

    def sample(self, epoch: int) -> RolloutBatch:
        """Roll out one batch of prompt groups; rewards overlap the following chunks."""
        cfg = self.cfg
        gen = torch.Generator().manual_seed(hash_seed(cfg.run.seed, epoch, self.rank))
        k = cfg.train.group_size
        local_groups = cfg.train.batch_size // k
        texts, metas, groups = sample_groups(self.prompts, local_groups, k, gen)
        groups = groups + self.rank * local_groups
        for m, g in zip(metas, groups.tolist()):
            m["group"] = g
        noise_gen = torch.Generator(self.acc.device).manual_seed(
            hash_seed(cfg.run.seed, epoch, self.rank, 1)
        )
        sigmas = self.adapter.schedule(cfg.sampler.num_steps)
        trained = self.selection.select(sigmas, groups, epoch, self.sampler)
        weights = self.selection.weights(sigmas, trained, self.sampler).to(self.acc.device)
        trajs, pending = [], []
        size = cfg.train.sample_batch_size or cfg.train.batch_size
        if self.rewards.groupwise:  # a group-wise reward must see whole groups in each chunk
            size = max(size // k, 1) * k
        cond_all = self.encode(texts)  # prompt encodings: once per batch, not per chunk
        with self.offloaded(("vae",)), self.objective.sampling():
            for sl in chunks(len(texts), size):
                cond = cond_all.index(sl)
                noise = self.adapter.noise(len(cond), noise_gen)
                traj = rollout(self.adapter, self.spec, cond, noise, sigmas, trained[sl],
                               generator=noise_gen)
                media = self.adapter.decode(traj.final)
                pending.append(self.rewards.submit(media, texts[sl], metas[sl]))
                trajs.append(traj)
        return RolloutBatch.build(trajs, texts, metas, groups, self.rewards.collect(pending),
                                  weights, iteration=epoch)

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict]:
        """Credit the rewards, gather them from every process, normalise every column within its
        group and keep this process's part: ``[B, V, J, P]``."""
        cfg = self.cfg
        signal = self.credit.rewards(self, batch)
        batch.regions = signal.regions
        groups = self.acc.gather(batch.groups.to(self.acc.device))
        adv, metrics = adv_lib.compute_advantages(
            self.rewards.for_advantages(signal, self.acc), groups, estimator=cfg.train.advantage,
            adv_clip=cfg.train.adv_clip or None, weights=self.rewards.weights,
            aggregation=cfg.reward.aggregation, params=cfg.train.advantage_params,
            state=self.adv_state, progress=batch.iteration / cfg.run.epochs,
            confidence=self.confidence(batch),
        )
        n = len(batch.groups)
        metrics.update(self.rewards.metrics(batch.reward, self.acc))
        metrics.update(self.reduce(dict(batch.info)))
        return adv[self.rank * n:(self.rank + 1) * n].to(self.acc.device), metrics

    def confidence(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Each trajectory's sampling log-prob summed over its trained steps, from every process,
        when the advantage estimator takes it (``rcc``); else None."""
        if "confidence" not in adv_lib.runtime_inputs(self.cfg.train.advantage):
            return None
        return self.acc.gather(batch.traj.log_probs.sum(1).to(self.acc.device)).cpu()

    def update(self, batch: RolloutBatch, adv: torch.Tensor, epoch: int) -> dict:
        """``num_inner_epochs`` passes of minibatch updates of the objective.

        Args:
            adv: this process's advantages, ``[B]`` or ``[B, V, J, P]``.
        """
        cfg = self.cfg.train
        batch.advantages = canonical_advantages(adv, batch)
        keep = torch.arange(len(batch.groups), device=self.acc.device)
        if cfg.skip_zero_advantage and cfg.beta == 0:
            # with a KL term a zero-advantage sample still has a gradient: it is trained
            keep = keep[batch.advantages.flatten(1).ne(0).any(1)]
        keep, out = self.prune(batch, keep, epoch)
        state = self.objective.prepare(batch, keep)  # only what will be trained
        size = cfg.train_batch_size or cfg.batch_size
        # every process runs the same number of minibatches so DDP collectives stay in step
        n_mb = int(self.acc.gather(torch.tensor([math.ceil(len(keep) / size)],
                                                device=self.acc.device)).max())
        units = self.objective.units(batch)
        sums: dict[str, float] = {}
        count = 0
        gen = torch.Generator().manual_seed(hash_seed(self.cfg.run.seed, epoch, self.rank, 2))
        for _ in range(cfg.num_inner_epochs):
            order = keep[torch.randperm(len(keep), generator=gen).to(keep.device)]
            for m in range(n_mb):
                idx, scale = order[m * size:(m + 1) * size], 1.0
                if len(idx) == 0:  # nothing left here: a zero-weight pass keeps DDP in step
                    idx, scale = torch.zeros(1, dtype=torch.long, device=keep.device), 0.0
                boundary = (m + 1) % cfg.gradient_accumulation == 0 or m == n_mb - 1
                for u, unit in enumerate(units):
                    sync = boundary and u == len(units) - 1
                    with nullcontext() if sync else self.acc.no_sync(self.adapter.transformer):
                        loss, metrics = self.objective.loss(batch, state, idx, unit)
                        self.acc.backward(loss * scale / (len(units) * cfg.gradient_accumulation))
                    if scale:
                        for key, value in metrics.items():
                            sums[key] = sums.get(key, 0.0) + float(value)
                        count += 1
                if boundary:
                    if cfg.max_grad_norm:
                        norm = self.acc.clip_grad_norm_(self.params, cfg.max_grad_norm)
                        sums["train/grad_norm"] = sums.get("train/grad_norm", 0.0) + float(norm)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    if self.ema is not None:
                        self.ema.update()
        self.objective.after_update()
        out.update({k: v / max(count, 1) for k, v in sums.items() if k != "train/grad_norm"})
        updates = cfg.num_inner_epochs * math.ceil(n_mb / cfg.gradient_accumulation)
        if "train/grad_norm" in sums:
            out["train/grad_norm"] = sums["train/grad_norm"] / max(updates, 1)
        out["train/samples"] = float(len(keep))
        return self.reduce(out)

    def prune(self, batch: RolloutBatch, keep: torch.Tensor, epoch: int) -> tuple[torch.Tensor,
                                                                                 dict]:
        """Drop low-information samples among ``keep`` (``train.pruner``) and give the kept ones
        importance weights ``batch.sample_weights``, scaled by ``kept / candidates`` so that the
        minibatch means stay unbiased estimates of the full batch's. Returns the kept indices
        and ``train/pruned_frac``, the fraction of training forwards saved."""
        gen = torch.Generator().manual_seed(hash_seed(self.cfg.run.seed, epoch, self.rank, 4))
        local, weight = self.pruner(batch.advantages[keep].cpu(), batch.groups[keep.cpu()], gen)
        kept = keep[local.to(keep.device)]
        weights = torch.zeros(len(batch.groups))
        weights[kept.cpu()] = weight.float().cpu() * len(kept) / max(len(keep), 1)
        batch.sample_weights = weights
        return kept, {"train/pruned_frac": 1 - len(kept) / max(len(keep), 1)}

    def reduce(self, metrics: dict) -> dict:
        """Mean of each metric over processes."""
        if self.world == 1 or not metrics:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], device=self.acc.device)
        values = self.acc.reduce(values, reduction="mean")
        return dict(zip(keys, values.tolist()))

    # ----------------------------------------------------------------- the loop
    def train(self) -> dict:
        """Run from ``start_epoch`` to ``run.epochs``; returns the last metrics row."""
        cfg = self.cfg.run
        started = time.time()
        base_eval = None
        if self.start_epoch == 0:
            with self.calls.paused():
                base_eval = self.evaluator.run(0)
            self.tracker.log(0, base_eval)  # the base model's eval row (no rollout yet)
        bar = tqdm(range(self.start_epoch, cfg.epochs), disable=not (
            cfg.progress and self.acc.is_main_process), desc="flowgrpo", unit="epoch")
        row: dict = {}
        for epoch in bar:
            t0 = time.time()
            batch = self.sample(epoch)
            self.views.extend(self, batch, epoch)
            t1 = time.time()
            adv, metrics = self.advantages(batch)
            metrics.update(self.update(batch, adv, epoch))
            metrics.update(self.reduce(self.calls.take()))
            t2 = time.time()
            step = epoch + 1
            metrics.update({"time/rollout": t1 - t0, "time/train": t2 - t1, "time/step": t2 - t0,
                            "epoch": float(epoch)})
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.epochs:
                with self.calls.paused():
                    metrics.update(self.evaluator.run(step))
            self.tracker.log(step, metrics)
            row = metrics
            # an epoch whose groups all had equal rewards trains nothing and has no loss metrics
            kl = metrics.get("train/kl", metrics.get("train/approx_kl", float("nan")))
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", kl=f"{kl:.2e}",
                            step_s=f"{t2 - t0:.1f}")
            if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.epochs:
                self.save(step)
        self.tracker.close()
        if self.acc.is_main_process:
            self.print_summary(base_eval, row, time.time() - started)
        return row

    def print_summary(self, base: dict | None, last: dict, seconds: float) -> None:
        lines = [f"run directory: {self.run_dir}", f"time: {seconds / 60:.1f} min"]
        if base and "eval/reward" in last:
            lines.append(f"eval reward: {base['eval/reward']:.3f} (base) -> "
                         f"{last['eval/reward']:.3f} (step {self.cfg.run.epochs})")
        if last:
            lines.append(f"last rollout reward/mean: {last['reward/mean']:.3f}")
        lines.append(f"plot: flowgrpo report {self.run_dir}")
        print("\n".join(lines))

    # ----------------------------------------------------------------- checkpoints
    def save(self, step: int) -> Path | None:
        """Write checkpoint ``step`` atomically (see :mod:`flowgrpo.checkpoint`)."""
        return ckpt.save_trainer(self, step)

    def load(self, folder: Path) -> None:
        """Continue from checkpoint ``folder``: weights, optimizer, EMA, RNG, epoch."""
        ckpt.load_trainer(self, folder)


def canonical_advantages(adv: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """Advantages as ``[B, V, J, P]``: ``[B]`` (one per sample) or any ``[B, V|1, J|1, P|1]``
    broadcast over views, trained steps and regions."""
    # an objective without per-step transitions (J = 0) still takes one advantage per sample
    views, steps = len(batch.views), max(batch.traj.num_trained, 1)
    regions = 1 if batch.regions is None else len(batch.regions)
    adv = adv.float().reshape(len(adv), *adv.shape[1:], *([1] * (4 - adv.ndim)))
    return adv.expand(len(adv), views, steps, regions)


def hash_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (seed, epoch, rank, stream)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p + 0x9E3779B9)) * 1099511628211) % (1 << 63)
    return h


def autocast_factory(mixed_precision: str, device: torch.device):
    """A zero-argument context factory: autocast in bf16/fp16, or nothing."""
    if mixed_precision == "fp32":
        return nullcontext
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)
