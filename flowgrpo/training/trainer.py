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
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

import samplers
from flowgrpo import console
from flowgrpo import distributed as engines
from flowgrpo.config.io import to_dict
from flowgrpo.config.schema import Config
from flowgrpo.data.prompts import sample_groups
from flowgrpo.errors import ConfigError, Interrupted, RunError, one_line
from flowgrpo.rl import advantages as adv_lib
from flowgrpo.rl.batch import GlobalView, RolloutBatch, chunks
from flowgrpo.run import checkpoint as ckpt
from flowgrpo.run.resume import RunFolder
from flowgrpo.run.tracking import Tracker
from flowgrpo.seeding import generator
from flowgrpo.training.components import Components, accelerator, build_components
from flowgrpo.training.evaluation import Evaluator
from flowgrpo.training.reward_runner import RewardStop


class Trainer:
    """Run built components in a run folder, one epoch after another.

    Args:
        components: the run's parts (:func:`~flowgrpo.training.components.build_components`).
        run: the run folder and the checkpoint it continues from, if any
            (:meth:`flowgrpo.run.resume.RunFolder.open`).

    :meth:`from_config` builds both from a config.
    """

    def __init__(self, components: Components, run: RunFolder) -> None:
        c = components
        cfg, acc = c.cfg, c.acc
        self.cfg, self.acc, self.session = cfg, acc, c.session
        self.rank, self.world = acc.process_index, acc.num_processes
        self.adapter, self.params = c.session.adapter, c.session.params
        self.optimizer, self.ema, self.calls = c.optimizer, c.ema, c.calls
        self.sampler, self.spec, self.selection = c.sampler, c.spec, c.selection
        self.credit, self.views, self.objective, self.pruner = (c.credit, c.views, c.objective,
                                                                c.pruner)
        self.rewards, self.prompts = c.rewards, c.prompts
        self.rollout = c.rollout
        # a group-wise reward or a tree rollout must see whole groups in each chunk
        self.whole_groups = self.rewards.groupwise or getattr(c.rollout, "groupwise", False)
        self.run_dir, self.run_folder = run.path, run
        self.adv_state: dict = {}  # a stateful advantage estimator's running statistics
        self.nonfinite_run = 0  # optimizer steps skipped in a row for non-finite gradients
        self.start_epoch = 0
        if run.checkpoint is not None:
            self.load(run.checkpoint)
        self.stop_signal = 0
        self.last_saved = self.start_epoch  # the newest checkpoint of this run, by step
        if acc.is_main_process:
            run.prepare(cfg, self.start_epoch, self.world)
        acc.wait_for_everyone()
        self.tracker = Tracker(
            self.run_dir, acc.is_main_process, cfg.run.tensorboard,
            cfg.run.wandb_project if cfg.run.wandb else None, to_dict(cfg),
            purge_step=self.start_epoch + 1 if run.checkpoint is not None else None,
        )
        self.evaluator = Evaluator(cfg, self.session, self.rewards, c.eval_prompts, acc,
                                   self.tracker, self.ema, sampler=c.sampler)

    @classmethod
    def from_config(cls, config: Config, resume: str | None = None, overwrite: bool = False, *,
                    sampler: samplers.Sampler | None = None,
                    reward_funcs: dict[str, Callable] | None = None) -> Trainer:
        """Build everything a run needs from a validated :class:`Config`.

        Args:
            resume: ``None`` (fresh run), ``"auto"`` (the newest intact checkpoint of
                ``run.output_dir``, or of the run under ``runs/`` saved last) or a checkpoint /
                run folder. The checkpoint's config must match ``config`` but for harmless keys
                (:data:`flowgrpo.run.resume.HARMLESS`).
            overwrite: start a fresh run even in a folder that holds one (its files are
                deleted); without it such a folder is refused.
            sampler, reward_funcs: parts passed in instead of built from the config (see
                :func:`~flowgrpo.training.components.build_components`).
        """
        if resume and overwrite:
            raise ConfigError("overwrite starts a fresh run and resume continues one: pass "
                              "only one of them (--overwrite, --resume)")
        acc = accelerator(config)
        run = RunFolder.open(config, acc, resume, overwrite)
        if acc.is_main_process:
            console.note(f"flowgrpo: {engines.describe(acc)}; run directory {run.path}")
        try:
            return cls(build_components(config, acc, sampler=sampler,
                                        reward_funcs=reward_funcs), run)
        except BaseException:
            run.release()
            raise

    def state_dict(self) -> dict:
        """The trainer's own counters (checkpointed in ``state.json``)."""
        return {"nonfinite_run": self.nonfinite_run}

    def load_state_dict(self, state: dict) -> None:
        self.nonfinite_run = int(state.get("nonfinite_run", 0))

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
        gen = generator("prompt_groups", cfg.run.seed, epoch)
        texts, metas, groups = sample_groups(self.prompts, n // k * self.world, k, gen)
        mine = slice(self.rank * n, (self.rank + 1) * n)
        texts, metas, groups = texts[mine], metas[mine], groups[mine]
        index = torch.arange(self.rank * n, (self.rank + 1) * n)
        # a sample's identity, for rewards that draw per sample (reward.mix_mode: sample)
        metas = [{**m, "iteration": epoch, "sample": i} for m, i in zip(metas, index.tolist())]
        gens = [generator("rollout_noise", cfg.run.seed, epoch, i, device=self.acc.device)
                for i in index.tolist()]
        sigmas = self.session.schedule()
        trained = self.selection.select(sigmas, groups, epoch, self.sampler)
        weights = self.selection.weights(sigmas, trained, self.sampler).to(self.acc.device)
        trajs, pending = [], []
        size = cfg.train.sample_batch_size or cfg.train.batch_size
        if self.whole_groups:
            size = max(size // k, 1) * k
        cond_all = self.session.encode(texts, metas)  # once per batch, not per chunk
        with self.session.offloaded(("vae",)), self.objective.sampling():
            for sl in chunks(len(texts), size):
                cond = cond_all.index(sl)
                noise = self.adapter.initial_noise(gens[sl], cond)
                traj = self.rollout(self.adapter, self.spec, cond, noise, sigmas, trained[sl],
                                    generator=gens[sl], groups=groups[sl])
                media = self.session.decode(traj.final)
                pending.append(self.rewards.submit(media, texts[sl], metas[sl]))
                trajs.append(traj)
        try:
            reward, valid = self.rewards.collect(pending, groups)
            error = None
        except RewardStop as err:
            error = err
        if engines.any_process(self.acc, error is not None):  # every process stops together
            raise error or RewardStop("a reward failed on another process")
        return RolloutBatch.build(trajs, texts, metas, groups, reward, weights, iteration=epoch,
                                  index=index, valid=valid)

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict]:
        """Credit the rewards, gather the batch metadata of every process once (the epoch's
        :class:`~flowgrpo.rl.batch.GlobalView`, kept in ``batch.everyone``), normalise every
        column within its group and keep this process's part: ``[B, V, J, P]``. Samples of
        skipped groups (``batch.valid`` False) take no part and get advantage 0."""
        cfg = self.cfg
        signal = self.credit.rewards(self.session, self.rewards.score, batch)
        batch.regions = signal.regions
        estimated = self.rewards.for_advantages(signal)  # a tensor, or one per component
        parts = estimated if isinstance(estimated, dict) else {"": estimated}
        components = batch.reward.components or {}
        columns = {"groups": batch.groups, "valid": batch.valid, "scores": batch.reward.scores,
                   **{f"component/{k}": v for k, v in components.items()},
                   **{f"rewards/{k}": v for k, v in parts.items()}}
        if "confidence" in adv_lib.runtime_inputs(cfg.train.advantage):  # rcc
            columns["confidence"] = batch.traj.log_probs.sum(1)
        every = engines.gather_columns(self.acc, columns)
        groups, valid = every["groups"], every["valid"].bool().cpu()
        parts = {k: every[f"rewards/{k}"].float().cpu() for k in parts}
        rewards = parts if isinstance(estimated, dict) else parts[""]
        confidence = every["confidence"].cpu() if "confidence" in every else None
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
        view = GlobalView(groups.cpu(), valid, canonical_advantages(full, batch), self.rank,
                          len(batch.groups))
        view.issued = view.mine(full).to(self.acc.device)
        batch.everyone = view
        metrics.update(self.rewards.metrics(
            every["scores"], {k: every[f"component/{k}"] for k in components},
            batch.reward.info, every["valid"]))
        metrics.update(engines.reduce(self.acc, dict(batch.info)))
        return view.issued, metrics

    def global_view(self, batch: RolloutBatch, adv: torch.Tensor) -> GlobalView:
        """The epoch's :class:`~flowgrpo.rl.batch.GlobalView` with this process's advantages
        ``adv``: the one :meth:`advantages` made when ``adv`` is what it returned, else one
        gathered here (a caller's own advantages)."""
        view = batch.everyone
        if view is not None and view.issued is adv:
            return view
        every = engines.gather_columns(self.acc, {"groups": batch.groups, "valid": batch.valid,
                                                  "advantages": batch.advantages})
        batch.everyone = GlobalView(every["groups"].cpu(), every["valid"].bool().cpu(),
                                    every["advantages"].float().cpu(), self.rank,
                                    len(batch.groups), issued=adv)
        return batch.everyone

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
        view = self.global_view(batch, adv)
        train = view.valid.clone()
        if cfg.skip_zero_advantage and cfg.beta == 0:
            # with a KL term a zero-advantage sample still has a gradient: it is trained
            train &= view.advantages.flatten(1).ne(0).any(1)
        keep, out = self.prune(batch, view, train.nonzero().flatten(), epoch)
        low = self.rank * n
        mine = keep[(keep >= low) & (keep < low + n)] - low
        state = self.objective.prepare(batch, mine.to(self.acc.device))  # only what is trained
        units = self.objective.units(batch)
        sums: dict[str, float] = {}
        count = 0.0
        norms: list[float] = []  # the gradient norm of each step taken (the same everywhere)
        skipped = 0
        for idx, scale, boundary in self.minibatches(keep, n, epoch):
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
        totals = engines.total(self.acc, {**sums, "_count": count})
        count = totals.pop("_count")
        out.update({k: v / max(count, 1) for k, v in totals.items()})
        if norms:
            out["train/grad_norm"] = sum(norms) / len(norms)
        out["train/samples"] = float(len(keep))  # trained samples of all processes
        if skipped:
            out["train/nonfinite_steps"] = float(skipped)
        return out

    def minibatches(self, keep: torch.Tensor, n: int,
                    epoch: int) -> Iterator[tuple[torch.Tensor, float, bool]]:
        """This process's part of every global minibatch of every inner epoch, cut from one order
        of the kept global indices drawn from ``(seed, epoch)``: ``(local indices, loss scale,
        accumulation boundary)``.

        DDP averages over processes, so a process's loss is scaled by its share
        ``len(idx) * world / len(part)`` of the minibatch; a process that holds none of a
        minibatch runs a zero-weight pass on its first sample, which keeps DDP in step."""
        cfg = self.cfg.train
        size = (cfg.train_batch_size or cfg.batch_size) * self.world  # a global minibatch
        n_mb = math.ceil(len(keep) / size)
        low = self.rank * n
        gen = generator("minibatch_order", self.cfg.run.seed, epoch)
        for _ in range(cfg.num_inner_epochs):
            order = keep[torch.randperm(len(keep), generator=gen)]
            for m in range(n_mb):
                part = order[m * size:(m + 1) * size]
                idx = part[(part >= low) & (part < low + n)] - low
                scale = len(idx) * self.world / len(part)
                if len(idx) == 0:
                    idx, scale = torch.zeros(1, dtype=torch.long), 0.0
                boundary = (m + 1) % cfg.gradient_accumulation == 0 or m == n_mb - 1
                yield idx.to(self.acc.device), scale, boundary

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

    def prune(self, batch: RolloutBatch, view: GlobalView, keep: torch.Tensor,
              epoch: int) -> tuple[torch.Tensor, dict]:
        """Drop low-information samples among the global indices ``keep`` (``train.pruner``)
        and give the kept ones importance weights (``view.sample_weights``, this process's part
        in ``batch.sample_weights``), scaled by ``kept / candidates`` so that the minibatch
        means stay unbiased estimates of the full batch's. Runs on the global view from
        ``(seed, epoch)``, the same on every process. Returns the kept global indices and
        ``train/pruned_frac``, the fraction of training forwards saved."""
        gen = generator("pruning", self.cfg.run.seed, epoch)
        local, weight = self.pruner(view.advantages[keep], view.groups[keep], gen)
        kept = keep[local.cpu()]
        weights = torch.zeros(len(view.groups))
        weights[kept] = weight.float().cpu() * len(kept) / max(len(keep), 1)
        view.sample_weights = weights
        batch.sample_weights = view.mine(weights)
        return kept, {"train/pruned_frac": 1 - len(kept) / max(len(keep), 1)}

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
            self.run_folder.release()
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
        metrics.update(engines.reduce(self.acc, self.calls.take()))
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
        console.result("\n".join(lines))

    # ----------------------------------------------------------------- checkpoints
    def save(self, step: int) -> Path | None:
        """Write checkpoint ``step`` atomically (see :mod:`flowgrpo.run.checkpoint`); a write
        that fails (a full disk, a read-only folder) is a one-line
        :class:`~flowgrpo.errors.RunError` naming the run folder (the half-written temporary
        folder is removed at the next start)."""
        from safetensors import SafetensorError

        try:
            path = ckpt.save(self.run_dir, step, self.acc, self.session,
                             lambda sharded: self.checkpoint_state(step, sharded),
                             self.cfg.run.keep_checkpoints)
        except (OSError, SafetensorError) as err:
            raise RunError(f"cannot write checkpoint step_{step} in {self.run_dir}: "
                           f"{one_line(err)}") from None
        self.last_saved = step
        return path

    def checkpoint_state(self, step: int, sharded: bool) -> dict:
        """What checkpoint ``step`` holds, each part built by its owner as whole CPU tensors
        (``sharded``: the weights are sharded, so a full fine-tuning saves the whole model)."""
        lora = self.cfg.model.lora
        return {
            "weights": self.session.state_dict(lora=lora, full_model=sharded and not lora),
            "ema": None if self.ema is None else engines.full_tensors(self.ema.state_dict()),
            "objective": engines.full_tensors(self.objective.state_dict()),
            "optimizer": engines.full_optimizer_state(self.optimizer.state_dict()),
            "state": {"step": step, "world_size": self.world, "calls": self.calls.state(),
                      "advantage_state": self.adv_state, "trainer_state": self.state_dict(),
                      "config": to_dict(self.cfg)},
        }

    def load(self, folder: Path) -> None:
        """Continue from checkpoint ``folder``: each owner takes its part back (weights,
        optimizer, EMA, RNG, counters, the objective's snapshots) and the run its epoch."""
        saved = ckpt.read(folder)
        try:
            self.session.load_state_dict(saved["weights"]["trainable"])
        except ValueError as err:
            raise RunError(f"checkpoint {folder} does not match this model: {err}") from None
        self.optimizer.load_state_dict(engines.shard_optimizer_state(saved["optimizer"],
                                                                     self.optimizer))
        if self.ema is not None and saved["ema"] is not None:
            self.ema.load_state_dict(saved["ema"])
        ckpt.load_rng(folder, self.rank)
        state = saved["state"]
        self.start_epoch = int(state["step"])  # one epoch per step
        self.calls.load(state.get("calls", {}))
        self.adv_state.update(state.get("advantage_state", {}))
        self.load_state_dict(state.get("trainer_state", {}))
        if saved["objective"] is not None:
            self.objective.load_state_dict(saved["objective"])


def canonical_advantages(adv: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """Advantages as ``[B, V, J, P]``: ``[B]`` (one per sample) or any ``[B, V|1, J|1, P|1]``
    broadcast over views, trained steps and regions."""
    # an objective without per-step transitions (J = 0) still takes one advantage per sample
    views, steps = len(batch.views), max(batch.traj.num_trained, 1)
    regions = 1 if batch.regions is None else len(batch.regions)
    adv = adv.float().reshape(len(adv), *adv.shape[1:], *([1] * (4 - adv.ndim)))
    return adv.expand(len(adv), views, steps, regions)


def _rows(rewards: torch.Tensor | dict, rows: torch.Tensor) -> torch.Tensor | dict:
    """The ``rows`` of the gathered rewards (a tensor, or a dict of components)."""
    if isinstance(rewards, dict):
        return {k: v[rows] for k, v in rewards.items()}
    return rewards[rows]
