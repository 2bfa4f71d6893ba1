"""What the trainer needs to run the same way under every accelerate engine.

Under DDP (and with one process) every process holds whole parameters. Under FSDP2
(``torch.distributed.fsdp.fully_shard``) each parameter is a ``DTensor`` of which a process
holds one shard (dim 0 split across processes), and the optimizer's per-parameter state is
sharded the same way. Checkpoints hold whole (full) CPU tensors in every case, so a checkpoint
written under one engine and world size resumes under any other:

- :func:`full_state_dict`, :func:`full_tensors` and :func:`full_optimizer_state` turn whatever
  the engine holds into full CPU tensors. With sharded tensors (:func:`any_sharded`) they are
  collectives: every process must call them, with the same names in the same order (not only
  the main process);
- :func:`copy_full_` and :func:`shard_optimizer_state` go back: each process keeps its shard of
  full tensors every process has read from the checkpoint (no communication);
- :func:`trainable_parameters` re-collects the trainable parameters after
  ``accelerator.prepare``: ``fully_shard`` replaces the parameter objects;
- :func:`set_deepspeed_micro_batch` gives DeepSpeed the per-process batch size that
  ``accelerator.prepare`` cannot infer without a dataloader;
- :func:`describe` is a one-line description of the engine, the world size and the device,
  which says when the engine the launcher asked for is not the one that runs;
- :func:`any_process`, :func:`total`, :func:`reduce` and :func:`gather_columns` are the
  training loop's collectives: a flag, sums and means of scalars, and the rows of an epoch's
  batch metadata from every process in one call.

DeepSpeed ZeRO-2 leaves parameters whole (it shards gradients and optimizer state inside its own
optimizer), so the parameter helpers are no-ops there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

try:  # torch >= 2.5; the private path before
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - older torch, or a build without distributed
    try:
        from torch.distributed._tensor import DTensor, distribute_tensor
    except ImportError:
        DTensor = distribute_tensor = None


def is_sharded(tensor: Any) -> bool:
    """True for a ``DTensor`` (a parameter or optimizer state under FSDP2)."""
    return DTensor is not None and isinstance(tensor, DTensor)


def any_sharded(module: torch.nn.Module) -> bool:
    """True when some parameter of ``module`` is sharded: then the gathers below are
    collectives that every process must join; otherwise only the process that writes needs to
    call them (so DDP processes do not each copy the model to the CPU)."""
    return any(is_sharded(p) for p in module.parameters())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` whole, detached, on the CPU. A collective when ``tensor`` is sharded."""
    if is_sharded(tensor):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu()


def full_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor of ``tensors`` whole on the CPU (e.g. the LoRA state dict from peft, or an
    EMA's shadow weights), in the mapping's order. A collective under FSDP2."""
    return {name: full_tensor(t) for name, t in tensors.items()}


def full_state_dict(module: torch.nn.Module,
                    names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The named parameters and buffers of ``module`` as full CPU tensors.

    Args:
        module: the model as prepared (plain, DDP-wrapped or ``fully_shard``-ed). A wrapper's
            ``module.`` prefix is not part of the names: pass the unwrapped model.
        names: parameter or buffer names (as in ``named_parameters``), or None for all of them.
            With LoRA, pass the trainable names so that the frozen base model is not gathered.

    Under FSDP2 this all-gathers one tensor at a time on every process, so every process must
    call it with the same ``names``; every process gets the full tensors.
    """
    found: dict[str, torch.Tensor] = dict(module.named_parameters())
    found.update(module.named_buffers())
    wanted = list(found) if names is None else list(names)
    missing = [n for n in wanted if n not in found]
    if missing:
        raise KeyError(f"{type(module).__name__} has no parameter or buffer {missing[:3]}")
    return {n: full_tensor(found[n]) for n in wanted}


@torch.no_grad()
def copy_full_(dst: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the whole tensor ``full`` into ``dst`` in place; a sharded ``dst`` takes its own
    shard. Every process must hold the same ``full`` (e.g. read from one checkpoint)."""
    if is_sharded(dst):
        full = full.to(device=dst.to_local().device, dtype=dst.dtype)
        full = _shard_like(full, dst)
    dst.copy_(full)


def _shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` as a ``DTensor`` placed like ``like``, each process slicing its own copy."""
    try:
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    except TypeError:  # pragma: no cover - torch < 2.5: broadcast from rank 0 instead
        return distribute_tensor(full, like.device_mesh, like.placements)


def full_optimizer_state(state: dict) -> dict:
    """An optimizer's ``state_dict()`` with every tensor whole on the CPU (a collective under
    FSDP2). The layout is the 1-process layout, so it loads under any engine and world size."""
    return {
        "state": {idx: {key: full_tensor(v) if isinstance(v, torch.Tensor) else v
                        for key, v in entry.items()}
                  for idx, entry in state["state"].items()},
        "param_groups": state["param_groups"],
    }


def shard_optimizer_state(state: dict, optimizer: torch.optim.Optimizer) -> dict:
    """The inverse of :func:`full_optimizer_state` for ``optimizer``: every state tensor of a
    sharded parameter's shape becomes a shard placed like that parameter (scalars such as
    Adam's ``step`` stay as they are). Pass the result to ``optimizer.load_state_dict``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out: dict[int, dict] = {}
    for idx, entry in state["state"].items():
        param = params[int(idx)]
        out[idx] = {
            key: _shard_like(v.to(device=param.to_local().device, dtype=param.dtype), param)
            if is_sharded(param) and isinstance(v, torch.Tensor) and v.shape == param.shape
            and v.dim() > 0 else v
            for key, v in entry.items()
        }
    return {"state": out, "param_groups": state["param_groups"]}


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``module`` that require a gradient, in ``named_parameters`` order.

    Call it again after ``accelerator.prepare``: ``fully_shard`` swaps every parameter for a new
    ``DTensor`` parameter, so a list taken before ``prepare`` points at stale tensors.
    """
    return [p for p in module.parameters() if p.requires_grad]


def set_deepspeed_micro_batch(accelerator: Any, batch_size: int) -> bool:
    """Under DeepSpeed, give the engine its per-process micro-batch size when the config leaves
    it ``auto``: without a prepared dataloader ``accelerator.prepare`` cannot infer it and
    raises. Call before ``prepare``; returns whether it set the value."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    kind = getattr(accelerator.distributed_type, "value", str(accelerator.distributed_type))
    if kind != "DEEPSPEED" or plugin is None or not plugin.is_auto(
            "train_micro_batch_size_per_gpu"):
        return False
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = int(batch_size)
    return True


# ----------------------------------------------------------------- which engine runs
def engine_name(accelerator: Any) -> str:
    """``"DDP"``, ``"FSDP2"``, ``"DeepSpeed ZeRO-2"``, ... for an ``Accelerator``; ``"no
    distributed engine"`` for a single process."""
    kind = getattr(accelerator.distributed_type, "value", str(accelerator.distributed_type))
    state = getattr(accelerator, "state", None)
    if kind == "FSDP":
        return f"FSDP{getattr(getattr(state, 'fsdp_plugin', None), 'fsdp_version', 1)}"
    if kind == "DEEPSPEED":
        stage = getattr(getattr(state, "deepspeed_plugin", None), "zero_stage", None)
        return f"DeepSpeed ZeRO-{stage}" if stage is not None else "DeepSpeed"
    if kind.startswith("MULTI_"):
        return "DDP"
    if kind == "NO":
        return "no distributed engine"
    return kind  # XLA, MEGATRON_LM


def requested_engine(environ: Mapping[str, str] | None = None) -> str | None:
    """The engine ``accelerate launch`` asked for through the environment, or None."""
    env = os.environ if environ is None else environ
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return f"FSDP{env.get('FSDP_VERSION', '1')}"
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        return f"DeepSpeed ZeRO-{stage}" if stage else "DeepSpeed"
    return None


def describe(accelerator: Any, environ: Mapping[str, str] | None = None) -> str:
    """One line: the world size, the engine and the device, e.g. ``"2 processes, DDP, cpu"``.

    Two silent fallbacks of accelerate are spelled out: a launcher that asked for FSDP or
    DeepSpeed while accelerate runs something else (it only enables them on accelerators, so on
    CPU an FSDP config runs DDP), and a launcher that started several processes of which this
    one runs alone (no accelerator and ``cpu=False``).
    """
    env = os.environ if environ is None else environ
    n = accelerator.num_processes
    engine = engine_name(accelerator)
    device = torch.device(accelerator.device).type
    line = f"{n} process{'es' if n != 1 else ''}, {engine}, {device}"
    asked = requested_engine(env)
    if asked is not None and not asked.startswith(engine):
        line += f" (the launcher asked for {asked}; accelerate runs {engine} on {device})"
    launched = int(env.get("WORLD_SIZE", "1") or 1)
    if launched > n:
        line += (f" (the launcher started {launched} processes; this one runs alone: on CPU "
                 "create the Accelerator with cpu=True)")
    return line


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP/compile wrapper."""
    while hasattr(module, "module"):
        module = module.module
    return getattr(module, "_orig_mod", module)


# ----------------------------------------------------------------- the training loop's collectives
def any_process(acc: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on any process (``acc``: the accelerate ``Accelerator``)."""
    if acc.num_processes == 1:
        return flag
    value = torch.tensor([float(flag)], device=acc.device)
    return bool(acc.reduce(value, reduction="sum")[0] > 0)


def total(acc: Any, values: dict) -> dict:
    """Sum of each value over processes."""
    if acc.num_processes == 1 or not values:
        return values
    keys = sorted(values)
    summed = acc.reduce(torch.tensor([float(values[k]) for k in keys], device=acc.device),
                        reduction="sum")
    return dict(zip(keys, summed.tolist()))


def reduce(acc: Any, metrics: dict) -> dict:
    """Mean of each metric over processes."""
    if acc.num_processes == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], device=acc.device)
    values = acc.reduce(values, reduction="mean")
    return dict(zip(keys, values.tolist()))


def gather_columns(acc: Any, columns: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every process's rows of each column, in global (process) order, on ``acc.device``, with
    one collective.

    Each column is a ``[B, ...]`` tensor with the same ``B`` on every process. The columns
    travel packed in one float64 ``[B, k]`` tensor, which holds bools, integers up to 2**53 and
    floats up to float64 exactly, and come back in their own dtypes and shapes."""
    if acc.num_processes == 1:
        return {k: v.to(acc.device) for k, v in columns.items()}
    flat = [v.reshape(len(v), -1) for v in columns.values()]
    everyone = acc.gather(torch.cat([f.to(acc.device, torch.float64) for f in flat], 1))
    out, start = {}, 0
    for (key, value), part in zip(columns.items(), flat):
        width = part.shape[1]
        out[key] = everyone[:, start:start + width].reshape(-1, *value.shape[1:]).to(value.dtype)
        start += width
    return out
