"""FSDP2 of a LoRA model on CPU processes over gloo; run by test_engines under
``accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2``.

accelerate enables FSDP only on accelerators: on CPU, ``Accelerator(cpu=True)`` runs DDP over
gloo whatever the config says (``describe`` reports it). So the job takes the process group
accelerate set up and shards the model with torch's own ``fully_shard``, the way accelerate's
FSDP2 path does (every ``_no_split_modules`` block, then the root).

Each process trains on its half of one global batch for ``STEPS`` AdamW steps; FSDP2 averages
the gradients, so the gathered weights equal those of :func:`reference`, the same training in
one process without sharding. Writes ``OUT/rank<R>.json`` and ``OUT/rank<R>.safetensors``.

Ends its process group through :func:`helpers.jobs.run`: this is the job that once aborted at
exit ("terminate called without an active exception", a rank's SIGABRT in gloo teardown), and
the reason is written there; it still did now and then with its groups destroyed, so it ends
without finalization (``hard_exit``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

STEPS = 2
ROWS = 8  # the global batch: each of W processes takes ROWS / W rows
DIM = 9  # odd, so that dim 0 of a weight splits unevenly across 2 processes
RANK = 3  # the LoRA rank, odd for the same reason


class Block(torch.nn.Module):
    """A residual two-layer block: the unit FSDP wraps (listed in ``_no_split_modules``)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(DIM, DIM)
        self.k = torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.k(torch.tanh(self.q(x)))


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.out = torch.nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build(base_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The frozen base (``base_dtype``) with an fp32 LoRA on every q and k, like
    ``flowgrpo.training.model_setup.make_trainable``; the same weights in every process (seeded)."""
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    model = Net().to(base_dtype).requires_grad_(False)
    config = LoraConfig(r=RANK, lora_alpha=RANK, init_lora_weights="gaussian",
                        target_modules=["q", "k"])
    model = inject_adapter_in_model(config, model, adapter_name="default")
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
            p.data = p.data.float()
    return model


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def train(model: torch.nn.Module, rank: int, world: int) -> torch.optim.Optimizer:
    """``STEPS`` AdamW steps on this process's rows of the global batch."""
    from flowgrpo.distributed import trainable_parameters

    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    for step in range(STEPS):
        x = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(step))
        mine = x.chunk(world)[rank]
        model(mine).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt


def reference() -> tuple[dict[str, torch.Tensor], ...]:
    """(trainable weights, peft LoRA state dict, flat optimizer tensors) of the same training in
    one process without sharding."""
    from peft.utils import get_peft_model_state_dict

    from flowgrpo.run.checkpoint import optimizer_to_flat

    model = build()
    opt = train(model, 0, 1)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    lora = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return weights, lora, optimizer_to_flat(opt.state_dict())[0]


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if type(module).__name__ in model._no_split_modules:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def mixed_dtypes(mesh, rank: int, world: int) -> str:
    """The trainer's layout (frozen bf16 base, fp32 LoRA, bf16 autocast) under FSDP2: "ok" or
    the error."""
    try:
        model = shard(build(torch.bfloat16), mesh)
        x = torch.randn(ROWS, DIM).chunk(world)[rank]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        return "ok"
    except Exception as e:  # reported, not raised: the test shows it
        return f"{type(e).__name__}: {e}"


def main(out: str) -> None:
    import accelerate
    import torch.distributed as dist
    from accelerate import Accelerator
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh

    from flowgrpo import distributed as engines
    from flowgrpo.run.checkpoint import optimizer_from_flat, optimizer_to_flat

    acc = Accelerator(cpu=True)  # as the trainer on a machine without a GPU: gloo
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    model = build()
    before = {id(p) for p in engines.trainable_parameters(model)}
    shard(model, mesh)
    params = engines.trainable_parameters(model)
    names = trainable_names(model)
    opt = train(model, rank, world)

    weights = engines.full_state_dict(model, names)
    lora = engines.full_tensors(get_peft_model_state_dict(model, adapter_name="default"))
    tensors, meta = optimizer_to_flat(engines.full_optimizer_state(opt.state_dict()))

    # back: a fresh sharded model and optimizer take the full tensors as a checkpoint would
    fresh = shard(build(), mesh)
    fresh_params = engines.trainable_parameters(fresh)
    for name, p in zip(names, fresh_params):
        engines.copy_full_(p, weights[name])
    fresh_opt = torch.optim.AdamW(fresh_params, lr=1e-2)
    fresh_opt.load_state_dict(engines.shard_optimizer_state(
        optimizer_from_flat(tensors, meta), fresh_opt))
    reloaded = engines.full_state_dict(fresh, names)
    opt_back, _ = optimizer_to_flat(engines.full_optimizer_state(fresh_opt.state_dict()))

    save_file({**{f"weights.{k}": v for k, v in weights.items()},
               **{f"lora.{k}": v for k, v in lora.items()},
               **{f"optimizer.{k}": v for k, v in tensors.items()}},
              str(Path(out) / f"rank{rank}.safetensors"))
    report = {
        "rank": rank, "world": world, "accelerate_world": acc.num_processes,
        "backend": dist.get_backend(), "describe": engines.describe(acc),
        "sharded": all(engines.is_sharded(p) for p in params),
        "replaced": not any(id(p) in before for p in params),
        "local_shapes": {n: list(p.to_local().shape) for n, p in zip(names, params)},
        "full_shapes": {n: list(p.shape) for n, p in zip(names, params)},
        "reload_equal": all(torch.equal(weights[n], reloaded[n]) for n in names),
        "optimizer_reload_equal": all(torch.equal(tensors[k], opt_back[k]) for k in tensors),
        "mixed_dtypes": mixed_dtypes(mesh, rank, world),
        "versions": {"torch": torch.__version__, "accelerate": accelerate.__version__},
    }
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    acc.wait_for_everyone()


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root), str(root / "tests")]  # this checkout's packages, the helpers
    from helpers.jobs import run

    run(main, sys.argv[1], hard_exit=True)
