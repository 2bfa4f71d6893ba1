"""Build, then run: everything a training run is made of, built from a config.

:func:`build_components` turns a validated :class:`~flowgrpo.config.schema.Config` into the
:class:`Components` the :class:`~flowgrpo.training.trainer.Trainer` runs: the model session, the
optimizer, the algorithm pieces, the rewards and the prompts. What a caller already holds is
passed in instead of named in the config: a sampler object, the reward callables of the Python
API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import samplers
from flowgrpo import distributed as engines
from flowgrpo.config.schema import Config
from flowgrpo.data.prompts import Prompt, load_prompts
from flowgrpo.distributed import unwrap
from flowgrpo.rl import credit as credit_lib
from flowgrpo.rl import objectives, pruning
from flowgrpo.rl import rollout as rollout_lib
from flowgrpo.rl import step_selection as steps_lib
from flowgrpo.rl.ema import EMA
from flowgrpo.rl.rollout import RolloutSpec
from flowgrpo.rl.session import ModelSession
from flowgrpo.rl.views import Views
from flowgrpo.seeding import stream_seed
from flowgrpo.training.calls import CallCounter
from flowgrpo.training.model_setup import compile_forward, load_adapter, make_trainable
from flowgrpo.training.reward_runner import RewardRunner


@dataclass
class Components:
    """The built parts of a run (see :func:`build_components`).

    Attributes:
        cfg: the config they were built from.
        acc: the accelerate ``Accelerator`` (engine, processes, device).
        session: the model session; ``session.params`` are the trainable parameters.
        optimizer: AdamW over ``session.params`` (prepared by the engine).
        ema: the EMA of the trainable weights (``train.ema``), or None.
        calls: the model-call counter.
        sampler, selection, credit, views, objective, pruner: the algorithm pieces.
        spec: how a rollout samples (the sampler, guidance, window, storage).
        rollout: the rollout piece (``sampler.rollout``), called as
            :func:`flowgrpo.rl.rollout.rollout` with the chunk's ``groups``.
        rewards: the reward runner.
        prompts, eval_prompts: the training and the eval prompt sets.
    """

    cfg: Config
    acc: Any
    session: ModelSession
    optimizer: torch.optim.Optimizer
    ema: EMA | None
    calls: CallCounter
    sampler: samplers.Sampler
    selection: steps_lib.StepSelection
    credit: credit_lib.Credit
    views: Views
    objective: objectives.Objective
    pruner: Any
    spec: RolloutSpec
    rewards: RewardRunner
    prompts: list[Prompt]
    eval_prompts: list[Prompt]
    rollout: Callable = rollout_lib.rollout


def accelerator(cfg: Config):
    """The accelerate ``Accelerator`` of a run (the CPU with ``run.cpu`` or without CUDA)."""
    from accelerate import Accelerator

    return Accelerator(cpu=cfg.run.cpu or not torch.cuda.is_available())


def build_components(cfg: Config, acc: Any, *, sampler: samplers.Sampler | None = None,
                     reward_funcs: dict[str, Callable] | None = None) -> Components:
    """Build a run's components from ``cfg`` on ``acc``, seeded from ``run.seed`` and the
    process index.

    Args:
        sampler: rolls out and trains in place of ``cfg.sampler.name``.
        reward_funcs: the rewards named in ``cfg.reward`` that the caller holds, by the name
            the config records (see :class:`~flowgrpo.training.reward_runner.RewardRunner`).
    """
    from accelerate.utils import set_seed

    set_seed(stream_seed("process", cfg.run.seed, acc.process_index))
    tc = cfg.train
    adapter = load_adapter(cfg.model, acc.device)
    params = make_trainable(cfg.model, adapter)
    reference_copy = getattr(adapter, "reference_copy", None)  # full fine-tuning only
    calls = CallCounter([m for m in (adapter.transformer, reference_copy) if m is not None])
    optimizer = torch.optim.AdamW(
        params, lr=tc.lr, betas=(tc.adam_beta1, tc.adam_beta2), weight_decay=tc.weight_decay,
        **optimizer_kernel(tc.optimizer_kernel, acc.device),
    )
    engines.set_deepspeed_micro_batch(acc, tc.train_batch_size or tc.batch_size)
    adapter.transformer, optimizer = acc.prepare(adapter.transformer, optimizer)
    if cfg.model.compile:
        for module in (adapter.transformer, reference_copy):
            if module is not None:
                compile_forward(module, cfg.model.compile)
    # FSDP2 replaces the parameter objects; under DDP these are the same ones
    params = engines.trainable_parameters(unwrap(adapter.transformer))
    session = ModelSession(
        adapter, acc.device, mixed_precision=cfg.model.mixed_precision,
        guidance=cfg.model.guidance, num_steps=cfg.sampler.num_steps,
        offload_encoders=cfg.model.offload_encoders,
        cache_prompt_embeds=cfg.model.cache_prompt_embeds, params=params)
    ema = EMA(params, tc.ema_decay) if tc.ema else None
    if sampler is None:
        sampler = samplers.build(cfg.sampler.name, **cfg.sampler.params)
    sampler.bind(adapter)  # a discrete sampler reads the model's token path; kinds must match
    selection = steps_lib.build(tc.step_selection, seed=cfg.run.seed, **tc.step_selection_params)
    credit = credit_lib.build(tc.credit, **tc.credit_params)
    rollout = rollout_lib.build(cfg.sampler.rollout, **cfg.sampler.rollout_params)
    views = Views(tc.views, tc.enhancer, tc.enhancer_params, cfg.run.seed)
    rewards = RewardRunner(cfg.reward, adapter, cfg.run, given=reward_funcs)
    prompts = load_prompts(cfg.data.prompts)
    spec = RolloutSpec(sampler, cfg.model.guidance, cfg.sampler.after_window,
                       cfg.sampler.flash_ratio, getattr(torch, cfg.sampler.storage_dtype),
                       session.autocast)
    policy = objectives.Policy(
        session, sampler, loss=tc.loss, loss_params=tc.loss_params, beta=tc.beta,
        batch_size=tc.train_batch_size or tc.batch_size, kl=tc.kl, params=params,
        seed=cfg.run.seed)
    objective = objectives.build(tc.objective, policy, **tc.objective_params)
    pruner = pruning.build(tc.pruner, **tc.pruner_params)
    eval_prompts = load_prompts(cfg.data.eval_prompts) if cfg.data.eval_prompts else prompts
    return Components(cfg, acc, session, optimizer, ema, calls, sampler, selection, credit,
                      views, objective, pruner, spec, rewards, prompts, eval_prompts, rollout)


def optimizer_kernel(kernel: str, device: torch.device) -> dict:
    """AdamW's implementation keyword: ``auto`` is the fused kernel on CUDA (one launch for all
    LoRA tensors instead of several per tensor) and torch's own choice elsewhere, which keeps
    the CPU runs' numbers as they were."""
    if kernel == "auto":
        return {"fused": True} if device.type == "cuda" else {}
    return {kernel: True}
