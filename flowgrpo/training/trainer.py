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
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

import samplers
from flowgrpo import console
from flowgrpo import distributed as engines
from flowgrpo.config.io import to_dict, to_yaml
from flowgrpo.config.schema import Config
from flowgrpo.data.prompts import load_prompts, sample_groups
from flowgrpo.distributed import unwrap
from flowgrpo.errors import Interrupted, RunError
from flowgrpo.rl import advantages as adv_lib
from flowgrpo.rl import credit as credit_lib
from flowgrpo.rl import objectives, pruning
from flowgrpo.rl import step_selection as steps_lib
from flowgrpo.rl.batch import RolloutBatch, chunks
from flowgrpo.rl.ema import EMA
from flowgrpo.rl.rollout import RolloutSpec, rollout
from flowgrpo.rl.session import ModelSession
from flowgrpo.rl.views import Views
from flowgrpo.run import checkpoint as ckpt
from flowgrpo.run import resume as resume_lib
from flowgrpo.run.tracking import Tracker, new_run_dir
from flowgrpo.seeding import hash_seed
from flowgrpo.training.calls import CallCounter
from flowgrpo.training.evaluation import Evaluator
from flowgrpo.training.model_setup import compile_forward, load_adapter, make_trainable
from flowgrpo.training.reward_runner import RewardRunner, RewardStop


class Trainer:
    """Build everything a run needs from a validated :class:`Config`.

    Args:
        config: the resolved configuration.
        resume: ``None`` (fresh run), ``"auto"`` (the newest intact checkpoint of
            ``run.output_dir``, or of the run under ``runs/`` saved last) or a checkpoint / run
            folder. The checkpoint's config must match ``config`` but for harmless keys
            (:data:`flowgrpo.run.resume.HARMLESS`).
        overwrite: start a fresh run even in a folder that holds one (its files are deleted);
            without it such a folder is refused.
    """

    def __init__(self, config: Config, resume: str | None = None,
                 overwrite: bool = False) -> None:
        from accelerate import Accelerator
        from accelerate.utils import broadcast_object_list, set_seed

        self.cfg = cfg = config
        self.acc = Accelerator(cpu=cfg.run.cpu or not torch.cuda.is_available())
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        main = self.acc.is_main_process
        checkpoint = (ckpt.find_checkpoint(resume, cfg.run.output_dir,
                                           warn=resume_lib.warn if main else None)
                      if resume else None)
        changed: dict = {}
        if checkpoint is not None:
            run_dir = checkpoint.parent.parent
            state = ckpt.read_json(checkpoint / "state.json")
            saved_world = int(state.get("world_size", 1))
            changed = resume_lib.check_config(state["config"], saved_world, cfg, self.world)
        else:
            run_dir = Path(cfg.run.output_dir) if cfg.run.output_dir else new_run_dir()
        self.run_dir = Path(broadcast_object_list([str(run_dir)])[0])
        if checkpoint is None:
            resume_lib.guard_fresh(self.run_dir, overwrite, clear=False)
        if main:
            print(f"flowgrpo: {engines.describe(self.acc)}; run directory {self.run_dir}",
                  flush=True)
        set_seed(cfg.run.seed + self.rank)

        self.adapter = load_adapter(cfg.model, self.acc.device)
        self.params = make_trainable(cfg.model, self.adapter)
        reference_copy = getattr(self.adapter, "reference_copy", None)  # full fine-tuning only
        self.calls = CallCounter([m for m in (self.adapter.transformer, reference_copy)
                                  if m is not None])
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.train.lr, betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
            weight_decay=cfg.train.weight_decay,
            **optimizer_kernel(cfg.train.optimizer_kernel, self.acc.device),
        )
        engines.set_deepspeed_micro_batch(self.acc, cfg.train.train_batch_size
                                          or cfg.train.batch_size)
        self.adapter.transformer, self.optimizer = self.acc.prepare(
            self.adapter.transformer, self.optimizer
        )
        if cfg.model.compile:
            for module in (self.adapter.transformer, reference_copy):
                if module is not None:
                    compile_forward(module, cfg.model.compile)
        # FSDP2 replaces the parameter objects; under DDP these are the same ones
        self.params = engines.trainable_parameters(unwrap(self.adapter.transformer))
        self.ema = EMA(self.params, cfg.train.ema_decay) if cfg.train.ema else None
        self.sampler = samplers.get(cfg.sampler.name, **cfg.sampler.params)
        tc = cfg.train
        self.selection = steps_lib.build(tc.step_selection, seed=cfg.run.seed,
                                         **tc.step_selection_params)
        self.credit = credit_lib.build(tc.credit, **tc.credit_params)
        self.views = Views(tc.views, tc.enhancer, tc.enhancer_params, cfg.run.seed)
        self.rewards = RewardRunner(cfg.reward, self.adapter, cfg.run)
        self.prompts = load_prompts(cfg.data.prompts)
        self.session = ModelSession(
            self.adapter, self.acc.device, mixed_precision=cfg.model.mixed_precision,
            guidance=cfg.model.guidance, num_steps=cfg.sampler.num_steps,
            offload_encoders=cfg.model.offload_encoders,
            cache_prompt_embeds=cfg.model.cache_prompt_embeds, params=self.params)
        self.spec = RolloutSpec(self.sampler, cfg.model.guidance, cfg.sampler.after_window,
                                cfg.sampler.flash_ratio, getattr(torch, cfg.sampler.storage_dtype),
                                self.session.autocast)
        policy = objectives.Policy(
            self.session, self.sampler, loss=tc.loss, loss_params=tc.loss_params, beta=tc.beta,
            batch_size=tc.train_batch_size or tc.batch_size, kl=tc.kl, params=self.params,
            seed=cfg.run.seed)
        self.objective = objectives.build(tc.objective, policy, **tc.objective_params)
        self.pruner = pruning.build(tc.pruner, **tc.pruner_params)
        self.adv_state: dict = {}  # a stateful advantage estimator's running statistics
        self.nonfinite_run = 0  # optimizer steps skipped in a row for non-finite gradients
        self.start_epoch = 0
        if checkpoint is not None:
            self.load(checkpoint)
        self.stop_signal = 0
        self.last_saved = self.start_epoch  # the newest checkpoint of this run, by step
        if main:  # the run folder: nothing of an earlier run is lost or duplicated
            self.run_dir.mkdir(parents=True, exist_ok=True)
            for leftover in ckpt.remove_leftovers(self.run_dir):
                resume_lib.warn(f"removed {leftover}, an unfinished checkpoint write")
            if checkpoint is None:
                resume_lib.guard_fresh(self.run_dir, overwrite, clear=True)
                (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            else:
                dropped = resume_lib.truncate_metrics(self.run_dir, self.start_epoch)
                resume_lib.record(self.run_dir, checkpoint, self.start_epoch, self.world,
                                  changed, dropped)
                notes = [f"changed: {', '.join(changed)}"] if changed else []
                if saved_world != self.world:
                    notes.append(f"written by {saved_world} processes; the global batch is kept")
                print(f"flowgrpo: resuming from {checkpoint} at step {self.start_epoch}"
                      + (f" ({'; '.join(notes)})" if notes else ""), flush=True)
        self.acc.wait_for_everyone()
        self.tracker = Tracker(
            self.run_dir, main, cfg.run.tensorboard,
            cfg.run.wandb_project if cfg.run.wandb else None, to_dict(cfg),
            purge_step=self.start_epoch + 1 if checkpoint is not None else None,
        )
        self.evaluator = Evaluator(
            cfg, self.session, self.rewards,
            load_prompts(cfg.data.eval_prompts or cfg.data.prompts), self.acc, self.tracker,
            self.ema,
        )

    def state_dict(self) -> dict:
        """The trainer's own counters (checkpointed in ``state.json``)."""
        return {"nonfinite_run": self.nonfinite_run}

    def load_state_dict(self, state: dict) -> None:
        self.nonfinite_run = int(state.get("nonfinite_run", 0))

    def use_sampler(self, sampler: samplers.Sampler) -> None:
        """Roll out and train with ``sampler`` from now on."""
        self.sampler = self.spec.sampler = self.objective.policy.sampler = sampler

    # ----------------------------------------------------------------- phases of an epoch
    def sample(self, epoch: int) -> RolloutBatch:
        """Roll out one batch of prompt groups; rewards overlap the following chunks.

        All randomness comes from global indices: the epoch's prompt groups are drawn for every
        process from ``(seed, epoch)`` and each process takes its share; each sample's noise
        comes from ``(seed, epoch, global sample index)``. One process with a global batch of
        ``2N`` and two with ``N`` each roll out the same samples."""
        cfg = self.cfg
        k = cfg.train.group_size
        n = cfg.train.batch_size
        gen = torch.Generator().manual_seed(hash_seed(cfg.run.seed, epoch))
        texts, metas, groups = sample_groups(self.prompts, n // k * self.world, k, gen)
        mine = slice(self.rank * n, (self.rank + 1) * n)
        texts, metas, groups = texts[mine], metas[mine], groups[mine]
        index = torch.arange(self.rank * n, (self.rank + 1) * n)
        # a sample's identity, for rewards that draw per sample (reward.mix_mode: sample)
        metas = [{**m, "iteration": epoch, "sample": i} for m, i in zip(metas, index.tolist())]
        gens = [torch.Generator(self.acc.device).manual_seed(hash_seed(cfg.run.seed, epoch, i, 1))
                for i in index.tolist()]
        sigmas = self.session.schedule()
        trained = self.selection.select(sigmas, groups, epoch, self.sampler)
        weights = self.selection.weights(sigmas, trained, self.sampler).to(self.acc.device)
        trajs, pending = [], []
        size = cfg.train.sample_batch_size or cfg.train.batch_size
        if self.rewards.groupwise:  # a group-wise reward must see whole groups in each chunk
            size = max(size // k, 1) * k
        cond_all = self.session.encode(texts, metas)  # once per batch, not per chunk
        with self.session.offloaded(("vae",)), self.objective.sampling():
            for sl in chunks(len(texts), size):
                cond = cond_all.index(sl)
                noise = torch.cat([self.adapter.noise(1, g) for g in gens[sl]])
                traj = rollout(self.adapter, self.spec, cond, noise, sigmas, trained[sl],
                               generator=gens[sl])
                media = self.session.decode(traj.final)
                pending.append(self.rewards.submit(media, texts[sl], metas[sl]))
                trajs.append(traj)
        try:
            reward, valid = self.rewards.collect(pending, groups)
            error = None
        except RewardStop as err:
            error = err
        if self.any_process(error is not None):  # every process stops together
            raise error or RewardStop("a reward failed on another process")
        return RolloutBatch.build(trajs, texts, metas, groups, reward, weights, iteration=epoch,
                                  index=index, valid=valid)

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict]:
        """Credit the rewards, gather them from every process, normalise every column within its
        group and keep this process's part: ``[B, V, J, P]``. Samples of skipped groups
        (``batch.valid`` False) take no part and get advantage 0."""
        cfg = self.cfg
        signal = self.credit.rewards(self.session, self.rewards.score, batch)
        batch.regions = signal.regions
        groups = self.acc.gather(batch.groups.to(self.acc.device))
        valid = self.acc.gather(batch.valid.to(self.acc.device)).bool().cpu()
        rewards = self.rewards.for_advantages(signal, self.acc)
        confidence = self.confidence(batch)
        adv, metrics = adv_lib.compute_advantages(
            _rows(rewards, valid), groups[valid.to(groups.device)], estimator=cfg.train.advantage,
            adv_clip=cfg.train.adv_clip or None, weights=self.rewards.weights,
            aggregation=cfg.reward.aggregation, params=cfg.train.advantage_params,
            state=self.adv_state, progress=batch.iteration / cfg.run.epochs,
            confidence=None if confidence is None else confidence[valid],
        ) if bool(valid.any()) else (None, {})
        full = torch.zeros(len(valid), *(() if adv is None else adv.shape[1:]))
        if adv is not None:
            full[valid] = adv.float().cpu()
        n = len(batch.groups)
        metrics.update(self.rewards.metrics(batch.reward, self.acc, valid=batch.valid))
        metrics.update(self.reduce(dict(batch.info)))
        return full[self.rank * n:(self.rank + 1) * n].to(self.acc.device), metrics

    def confidence(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Each trajectory's sampling log-prob summed over its trained steps, from every process,
        when the advantage estimator takes it (``rcc``); else None."""
        if "confidence" not in adv_lib.runtime_inputs(self.cfg.train.advantage):
            return None
        return self.acc.gather(batch.traj.log_probs.sum(1).to(self.acc.device)).cpu()

    def update(self, batch: RolloutBatch, adv: torch.Tensor, epoch: int) -> dict:
        """``num_inner_epochs`` passes of minibatch updates of the objective.

        Minibatches are cut from one order of the global batch, drawn from ``(seed, epoch)``;
        each process trains its samples of each global minibatch, its loss scaled by its share,
        so the update is the global minibatch's mean gradient on any number of processes.

        Args:
            adv: this process's advantages, ``[B]`` or ``[B, V, J, P]``.
        """
        cfg = self.cfg.train
        batch.advantages = canonical_advantages(adv, batch)
        n = len(batch.groups)
        train = batch.valid.to(self.acc.device).clone()
        if cfg.skip_zero_advantage and cfg.beta == 0:
            # with a KL term a zero-advantage sample still has a gradient: it is trained
            train &= batch.advantages.flatten(1).ne(0).any(1)
        everywhere = self.acc.gather(train).bool().cpu()
        keep, out = self.prune(batch, everywhere.nonzero().flatten(), epoch)
        low = self.rank * n
        mine = keep[(keep >= low) & (keep < low + n)] - low
        state = self.objective.prepare(batch, mine.to(self.acc.device))  # only what is trained
        size = (cfg.train_batch_size or cfg.batch_size) * self.world  # a global minibatch
        n_mb = math.ceil(len(keep) / size)
        units = self.objective.units(batch)
        sums: dict[str, float] = {}
        count = 0.0
        norms: list[float] = []  # the gradient norm of each step taken (the same everywhere)
        skipped = 0
        gen = torch.Generator().manual_seed(hash_seed(self.cfg.run.seed, epoch, 2))
        for _ in range(cfg.num_inner_epochs):
            order = keep[torch.randperm(len(keep), generator=gen)]
            for m in range(n_mb):
                part = order[m * size:(m + 1) * size]
                idx = part[(part >= low) & (part < low + n)] - low
                # DDP averages over processes: a share of len(idx) / len(part) of the minibatch
                scale = len(idx) * self.world / len(part)
                if len(idx) == 0:  # nothing here: a zero-weight pass keeps DDP in step
                    idx, scale = torch.zeros(1, dtype=torch.long), 0.0
                idx = idx.to(self.acc.device)
                boundary = (m + 1) % cfg.gradient_accumulation == 0 or m == n_mb - 1
                for u, unit in enumerate(units):
                    sync = boundary and u == len(units) - 1
                    with nullcontext() if sync else self.acc.no_sync(self.adapter.transformer):
                        loss, metrics = self.objective.loss(batch, state, idx, unit)
                        self.acc.backward(loss * scale / (len(units) * cfg.gradient_accumulation))
                    if scale:  # metrics are means over the trained samples of all processes
                        for key, value in metrics.items():
                            sums[key] = sums.get(key, 0.0) + float(value) * len(idx)
                        count += len(idx)
                if boundary:
                    taken, norm = self.step_optimizer()
                    skipped += not taken
                    if norm is not None:
                        norms.append(norm)
        self.objective.after_update()
        totals = self.total({**sums, "_count": count})
        count = totals.pop("_count")
        out.update({k: v / max(count, 1) for k, v in totals.items()})
        if norms:
            out["train/grad_norm"] = sum(norms) / len(norms)
        out["train/samples"] = float(len(keep))  # trained samples of all processes
        if skipped:
            out["train/nonfinite_steps"] = float(skipped)
        return out

    def step_optimizer(self) -> tuple[bool, float | None]:
        """Clip and take an optimizer step, unless the gradient is not finite: then skip it and
        count it; ``run.max_nonfinite_steps`` skipped in a row stop the run. Returns whether the
        step was taken and its gradient norm when one is reported (``train.max_grad_norm`` > 0).
        """
        cfg = self.cfg.train
        if cfg.max_grad_norm:
            norm = self.acc.clip_grad_norm_(self.params, cfg.max_grad_norm)
        else:  # measured only to find a non-finite gradient, not reported
            grads = [p.grad.detach().norm() for p in self.params if p.grad is not None]
            norm = torch.stack(grads).norm() if grads else torch.zeros(())
        # DeepSpeed clips inside its engine and may not report a norm
        finite = norm is None or bool(torch.isfinite(torch.as_tensor(norm)))
        if finite:
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
            self.nonfinite_run = 0
        else:
            self.nonfinite_run += 1
        self.optimizer.zero_grad(set_to_none=True)
        limit = self.cfg.run.max_nonfinite_steps
        if self.nonfinite_run >= limit:
            raise RunError(f"{limit} optimizer steps in a row had a non-finite loss or gradient "
                           f"(run.max_nonfinite_steps) and were skipped; the last checkpoint is "
                           f"step_{self.last_saved}: continue from it with --resume auto once "
                           f"the cause is fixed (e.g. a lower train.lr)")
        return finite, (float(norm) if finite and norm is not None and cfg.max_grad_norm
                        else None)

    def prune(self, batch: RolloutBatch, keep: torch.Tensor, epoch: int) -> tuple[torch.Tensor,
                                                                                 dict]:
        """Drop low-information samples among the global indices ``keep`` (``train.pruner``)
        and give the kept ones importance weights ``batch.sample_weights``, scaled by ``kept /
        candidates`` so that the minibatch means stay unbiased estimates of the full batch's.
        Runs on the gathered batch from ``(seed, epoch)``, the same on every process. Returns
        the kept global indices and ``train/pruned_frac``, the fraction of training forwards
        saved."""
        n = len(batch.groups)
        advantages = self.acc.gather(batch.advantages.contiguous()).cpu()
        groups = self.acc.gather(batch.groups.to(self.acc.device)).cpu()
        gen = torch.Generator().manual_seed(hash_seed(self.cfg.run.seed, epoch, 4))
        local, weight = self.pruner(advantages[keep], groups[keep], gen)
        kept = keep[local.cpu()]
        weights = torch.zeros(len(groups))
        weights[kept] = weight.float().cpu() * len(kept) / max(len(keep), 1)
        batch.sample_weights = weights[self.rank * n:(self.rank + 1) * n]
        return kept, {"train/pruned_frac": 1 - len(kept) / max(len(keep), 1)}

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any process."""
        if self.world == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.acc.device)
        return bool(self.acc.reduce(value, reduction="sum")[0] > 0)

    def total(self, values: dict) -> dict:
        """Sum of each value over processes."""
        if self.world == 1 or not values:
            return values
        keys = sorted(values)
        summed = self.acc.reduce(torch.tensor([float(values[k]) for k in keys],
                                              device=self.acc.device), reduction="sum")
        return dict(zip(keys, summed.tolist()))

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
        """Run from ``start_epoch`` to ``run.epochs``; returns the last metrics row.

        SIGINT and SIGTERM finish the current epoch, write a checkpoint and raise
        :class:`~flowgrpo.errors.Interrupted` (exit 130 or 143); a second signal acts at once.
        A reward fault under the ``stop`` policy writes the checkpoint of the epochs done and
        raises :class:`~flowgrpo.errors.RunError`."""
        cfg = self.cfg.run
        started = time.time()
        base_eval = None
        previous = self.catch_signals()
        try:
            if self.start_epoch == 0:
                with self.calls.paused():
                    base_eval = self.evaluator.run(0)
                self.tracker.log(0, base_eval)  # the base model's eval row (no rollout yet)
            bar = tqdm(range(self.start_epoch, cfg.epochs), disable=not console.show_progress(
                cfg.progress and self.acc.is_main_process), desc="flowgrpo", unit="epoch")
            row: dict = {}
            for epoch in bar:
                row = self.epoch(epoch, bar)
                step = epoch + 1
                if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.epochs:
                    self.save(step)
                self.check_signals(step)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.tracker.close()
        if self.acc.is_main_process:
            self.print_summary(base_eval, row, time.time() - started)
        return row

    def epoch(self, epoch: int, bar) -> dict:
        """One epoch: roll out, credit, update, log (and eval); returns its metrics row."""
        cfg = self.cfg.run
        t0 = time.time()
        try:
            batch = self.sample(epoch)
        except RewardStop as err:
            self.stop_at(epoch, str(err))
        self.views.extend(self.session, self.rewards.score, batch, epoch)
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
        # an epoch whose groups all had equal rewards trains nothing and has no loss metrics
        kl = metrics.get("train/kl", metrics.get("train/approx_kl", float("nan")))
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", kl=f"{kl:.2e}",
                        step_s=f"{t2 - t0:.1f}")
        return metrics

    def stop_at(self, done: int, reason: str) -> None:
        """Stop before epoch ``done`` changed anything: checkpoint the ``done`` epochs (unless
        saved already) and raise a one-line :class:`~flowgrpo.errors.RunError`."""
        if done > self.last_saved:
            self.save(done)
        where = (f"checkpoint step_{done} holds the {done} epochs done; continue with --resume "
                 "auto" if done else "nothing was trained yet")
        raise RunError(f"{reason}; stopped at step {done} ({where})")

    def catch_signals(self) -> dict:
        """Route SIGINT and SIGTERM to :meth:`check_signals` (main thread only); returns the
        handlers to restore."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(signum: int, frame) -> None:
            self.stop_signal = signum
            for sig, handler in previous.items():  # a second signal acts at once
                signal.signal(sig, handler)

        for sig in previous:
            signal.signal(sig, on_signal)
        return previous

    def check_signals(self, step: int) -> None:
        """After each epoch: when any process got a signal, checkpoint and stop everywhere."""
        signum = self.stop_signal
        if self.world > 1:
            signum = int(self.acc.reduce(torch.tensor([signum], device=self.acc.device),
                                         reduction="max")[0])
        if not signum:
            return
        if step > self.last_saved:
            self.save(step)
        name = signal.Signals(signum).name
        raise Interrupted(f"stopped by {name} after step {step}; checkpoint step_{step} written; "
                          f"continue with --resume auto", 128 + signum)

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
        """Write checkpoint ``step`` atomically (see :mod:`flowgrpo.run.checkpoint`)."""
        path = ckpt.save_trainer(self, step)
        self.last_saved = step
        return path

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


def optimizer_kernel(kernel: str, device: torch.device) -> dict:
    """AdamW's implementation keyword: ``auto`` is the fused kernel on CUDA (one launch for all
    LoRA tensors instead of several per tensor) and torch's own choice elsewhere, which keeps
    the CPU runs' numbers as they were."""
    if kernel == "auto":
        return {"fused": True} if device.type == "cuda" else {}
    return {kernel: True}


def _rows(rewards: torch.Tensor | dict, rows: torch.Tensor) -> torch.Tensor | dict:
    """The ``rows`` of the gathered rewards (a tensor, or a dict of components)."""
    if isinstance(rewards, dict):
        return {k: v[rows] for k, v in rewards.items()}
    return rewards[rows]
