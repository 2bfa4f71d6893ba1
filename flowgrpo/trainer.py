"""One GRPO trainer for every pipeline family, sampler, loss and reward.

Each epoch reads top to bottom: (1) draw prompt groups, (2) roll out with the configured sampler
and window while rewards run (inline or in a worker pool), (3) gather rewards across processes and
compute group-relative advantages, (4) replay the trained steps with gradients for
``num_inner_epochs`` passes, (5) log, evaluate and checkpoint.
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
from .batch import RolloutBatch, chunks
from .config import Config
from .config_io import to_dict, to_yaml
from .data import load_prompts, sample_groups
from .ema import EMA
from .evaluate import Evaluator
from .grpo import replay_step, step_loss
from .model import load_adapter, make_trainable
from .rewards import RewardRunner
from .rollout import rollout
from .tracking import Tracker, new_run_dir


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
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.train.lr, betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
            weight_decay=cfg.train.weight_decay,
        )
        self.adapter.transformer, self.optimizer = self.acc.prepare(
            self.adapter.transformer, self.optimizer
        )
        self.ema = EMA(self.params, cfg.train.ema_decay) if cfg.train.ema else None
        self.sampler = samplers.get(cfg.sampler.name, **cfg.sampler.params)
        self.window = None
        if cfg.sampler.window_size:
            self.window = samplers.Window(
                cfg.sampler.window_size, stride=cfg.sampler.window_stride,
                shift_every=cfg.sampler.window_shift_every,
                strategy=cfg.sampler.window_strategy, start=cfg.sampler.window_start,
                seed=cfg.run.seed,
            )
        self.rewards = RewardRunner(cfg.reward, self.adapter)
        self.prompts = load_prompts(cfg.data.prompts)
        self.autocast = autocast_factory(cfg.model.mixed_precision, self.acc.device)
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

    # ----------------------------------------------------------------- phases of an epoch
    def trained_steps(self, epoch: int, sigmas: torch.Tensor) -> list[int]:
        """Stochastic, trained step indices at this epoch: the window's, or without a window
        every step of ``sigmas`` the sampler calls trainable (never the last, into sigma = 0)."""
        n = len(sigmas) - 1
        if self.window:
            return self.window.steps(n, epoch)
        s = sigmas.tolist()
        return [k for k in range(n - 1) if self.sampler.trainable(s[k], s[k + 1])]

    def encode(self, prompts: list[str]):
        """Encode each distinct prompt once and expand to the batch; encodings are cached across
        epochs when the family allows it (``per_prompt_encoding``) and the config asks for it."""
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
        if not self.cfg.model.cache_prompt_embeds:
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
        trained = self.trained_steps(epoch, sigmas)
        trajs, pending = [], []
        size = cfg.train.sample_batch_size or cfg.train.batch_size
        if self.rewards.groupwise:  # a group-wise reward must see whole groups in each chunk
            size = max(size // k, 1) * k
        cond_all = self.encode(texts)  # prompt encodings: once per batch, not per chunk
        with self.offloaded(("vae",)):
            for sl in chunks(len(texts), size):
                cond = cond_all.index(sl)
                noise = self.adapter.noise(len(cond), noise_gen)
                traj = rollout(
                    self.adapter, self.sampler, cond, noise, sigmas, trained,
                    cfg.model.guidance, generator=noise_gen,
                    after_window=cfg.sampler.after_window, flash_ratio=cfg.sampler.flash_ratio,
                    storage_dtype=getattr(torch, cfg.sampler.storage_dtype),
                    autocast=self.autocast,
                )
                media = self.adapter.decode(traj.final)
                pending.append(self.rewards.submit(media, texts[sl], metas[sl]))
                trajs.append(traj)
        return RolloutBatch.build(trajs, texts, metas, groups, self.rewards.collect(pending))

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict]:
        """Gather rewards from every process, normalize per group, keep this process's part."""
        cfg = self.cfg
        gather = self.acc.gather
        groups = gather(batch.groups.to(self.acc.device))
        rewards = self.rewards.for_advantages(batch.reward, self.acc)
        adv, metrics = adv_lib.compute_advantages(
            rewards, groups, estimator=cfg.train.advantage, adv_clip=cfg.train.adv_clip or None,
            weights=self.rewards.weights, aggregation=cfg.reward.aggregation,
        )
        n = len(batch.groups)
        mine = slice(self.rank * n, (self.rank + 1) * n)
        metrics.update(self.rewards.metrics(batch.reward, self.acc))
        if batch.reward.regions is not None:
            amap = region_advantages(gather(batch.reward.regions.to(self.acc.device)).cpu(),
                                     groups.cpu(), cfg.train.advantage, cfg.train.adv_clip)
            local = amap[mine].to(self.acc.device)
            batch.position_adv = self.adapter.position_weights(local, batch.traj.latents[:, 0])
            # the sign lives in the per-position weights; the sample advantage only says
            # whether there is anything to learn from this sample
            adv = (amap.flatten(1).abs().amax(1) > 0).float()
            metrics["rollout/region_adv_abs_mean"] = amap.abs().mean().item()
        return adv[mine].to(self.acc.device), metrics

    def update(self, batch: RolloutBatch, adv: torch.Tensor, epoch: int) -> dict:
        """``num_inner_epochs`` passes of minibatch GRPO updates over the trained steps."""
        cfg = self.cfg.train
        traj = batch.traj
        keep = torch.arange(len(adv), device=adv.device)
        if cfg.skip_zero_advantage:
            keep = keep[adv != 0]
        size = cfg.train_batch_size or cfg.batch_size
        # every process runs the same number of minibatches so DDP collectives stay in step
        n_mb = int(self.acc.gather(torch.tensor([math.ceil(len(keep) / size)],
                                                device=self.acc.device)).max())
        steps = len(traj.trained)
        logp_old = traj.log_probs
        if batch.position_adv is not None:
            logp_old = self.weighted_log_probs(batch, size)
        sums: dict[str, float] = {}
        count = 0
        gen = torch.Generator().manual_seed(hash_seed(self.cfg.run.seed, epoch, self.rank, 2))
        for _ in range(cfg.num_inner_epochs):
            order = keep[torch.randperm(len(keep), generator=gen).to(keep.device)]
            for m in range(n_mb):
                idx, scale = order[m * size:(m + 1) * size], 1.0
                if len(idx) == 0:  # nothing left here: a zero-weight pass keeps DDP in step
                    idx, scale = torch.zeros(1, dtype=torch.long, device=adv.device), 0.0
                boundary = (m + 1) % cfg.gradient_accumulation == 0 or m == n_mb - 1
                for j in range(steps):
                    sync = boundary and j == steps - 1
                    with nullcontext() if sync else self.acc.no_sync(self.adapter.transformer):
                        result = replay_step(
                            self.adapter, self.sampler, traj, idx, j, self.cfg.model.guidance,
                            with_kl=cfg.beta > 0, weight=batch.weights(idx, j),
                            autocast=self.autocast,
                        )
                        loss, metrics = step_loss(result, logp_old[idx, j], adv[idx],
                                                  cfg.loss, cfg.loss_params, cfg.beta)
                        self.acc.backward(loss * scale / (steps * cfg.gradient_accumulation))
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
        out = {k: v / max(count, 1) for k, v in sums.items() if k != "train/grad_norm"}
        updates = cfg.num_inner_epochs * math.ceil(n_mb / cfg.gradient_accumulation)
        if "train/grad_norm" in sums:
            out["train/grad_norm"] = sums["train/grad_norm"] / max(updates, 1)
        out["train/samples"] = float(len(keep))
        return self.reduce(out)

    @torch.no_grad()
    def weighted_log_probs(self, batch: RolloutBatch, size: int) -> torch.Tensor:
        """Sampling-policy log-probs under region weights ``[B, steps]`` (computed before any
        update, so they are the old policy's)."""
        out = []
        for sl in chunks(len(batch.groups), size):
            idx = torch.arange(sl.start, sl.stop, device=self.acc.device)
            out.append(torch.stack([
                replay_step(self.adapter, self.sampler, batch.traj, idx, j,
                            self.cfg.model.guidance, weight=batch.weights(idx, j),
                            autocast=self.autocast).log_prob
                for j in range(len(batch.traj.trained))], 1))
        return torch.cat(out)

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
            base_eval = self.evaluator.run(0)
            self.tracker.log(0, base_eval)  # the base model's eval row (no rollout yet)
        bar = tqdm(range(self.start_epoch, cfg.epochs), disable=not (
            cfg.progress and self.acc.is_main_process), desc="flowgrpo", unit="epoch")
        row: dict = {}
        for epoch in bar:
            t0 = time.time()
            batch = self.sample(epoch)
            t1 = time.time()
            adv, metrics = self.advantages(batch)
            metrics.update(self.update(batch, adv, epoch))
            t2 = time.time()
            step = epoch + 1
            metrics.update({"time/rollout": t1 - t0, "time/train": t2 - t1, "time/step": t2 - t0,
                            "epoch": float(epoch)})
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.epochs:
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


def region_advantages(regions: torch.Tensor, groups: torch.Tensor, estimator: str,
                      adv_clip: float) -> torch.Tensor:
    """Per-position group-relative advantages ``[B, h, w]`` from region scores ``[B, h, w]``
    (SpatialFlow-GRPO): each grid position is normalized within its group like a reward."""
    est = adv_lib.get(estimator)
    flat = regions.float().flatten(1)
    amap = torch.stack([est(flat[:, i], groups) for i in range(flat.shape[1])], 1)
    if adv_clip:
        amap = amap.clamp(-adv_clip, adv_clip)
    return amap.reshape(regions.shape)


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
