"""Checkpoints: written atomically, safetensors + JSON only (nothing is unpickled on resume).

``RUN/checkpoints/step_<N>/`` holds:

- ``lora/pytorch_lora_weights.safetensors``: the adapter, loadable by the family's diffusers
  pipeline (``pipe.load_lora_weights(folder)``); or ``transformer/`` (``save_pretrained``) for
  full fine-tuning;
- ``trainable.safetensors``: the trainable weights by parameter name (exact resume);
  ``ema.safetensors`` when EMA is on;
- ``optimizer.safetensors`` + ``optimizer.json``: optimizer tensors and hyper-parameters;
- ``rng_rank<R>.safetensors``: torch RNG states of each process;
- ``state.json``: the step (= epochs done) to continue from (the window position is a function
  of it) and the config.

A checkpoint is first written to a temporary sibling folder and then renamed, so a crash never
leaves a half-written ``step_<N>``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from .config_io import to_dict
from .model import lora_state_dict, unwrap

if TYPE_CHECKING:
    from .trainer import Trainer


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Completed checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")
             and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def optimizer_to_flat(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """A torch optimizer ``state_dict`` -> (tensors for safetensors, JSON-able rest)."""
    tensors, scalars = {}, {}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def optimizer_from_flat(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for flat, value in [*tensors.items(), *meta["scalars"].items()]:
        idx, key = flat.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _rng_state() -> dict[str, torch.Tensor]:
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda{i}"] = s
    return states


def save_rng(folder: Path, rank: int) -> None:
    save_file(_rng_state(), str(folder / f"rng_rank{rank}.safetensors"))


def load_rng(folder: Path, rank: int) -> None:
    path = folder / f"rng_rank{rank}.safetensors"
    if not path.is_file():
        return
    states = load_file(str(path))
    torch.set_rng_state(states["torch"])
    cuda = [states[k] for k in sorted(states) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def begin(run_dir: Path, step: int) -> Path:
    """A fresh temporary folder for checkpoint ``step`` (see :func:`commit`)."""
    tmp = Path(run_dir) / "checkpoints" / f".tmp_step_{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path, keep: int) -> Path:
    """Atomically publish ``tmp`` as ``step_<N>`` and delete all but the newest ``keep``."""
    final = tmp.with_name(tmp.name.removeprefix(".tmp_"))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in checkpoint_dirs(final.parent.parent)[:-keep]:
        shutil.rmtree(old)
    return final


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def save_trainer(trainer: Trainer, step: int) -> Path | None:
    """Write checkpoint ``step`` atomically (see :mod:`flowgrpo.checkpoint`)."""
    trainer.acc.wait_for_everyone()
    tmp = trainer.run_dir / "checkpoints" / f".tmp_step_{step}"
    if trainer.acc.is_main_process:
        begin(trainer.run_dir, step)
    trainer.acc.wait_for_everyone()
    save_rng(tmp, trainer.rank)
    trainer.acc.wait_for_everyone()
    final = None
    if trainer.acc.is_main_process:
        model = unwrap(trainer.adapter.transformer)
        if trainer.cfg.model.lora:
            meta = model.peft_config["default"].to_dict()
            meta["target_modules"] = sorted(meta["target_modules"])
            trainer.adapter.save_lora(str(tmp / "lora"), lora_state_dict(trainer.adapter), meta)
        elif hasattr(model, "save_pretrained"):
            model.save_pretrained(str(tmp / "transformer"))
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        save_tensors(tmp / "trainable.safetensors",
                          dict(zip(names, trainer.params)))
        if trainer.ema is not None:
            save_tensors(tmp / "ema.safetensors", trainer.ema.state_dict())
        snapshots = trainer.objective.state_dict()  # e.g. DiffusionNFT's old policy
        if snapshots:
            save_tensors(tmp / "objective.safetensors", snapshots)
        tensors, meta_opt = optimizer_to_flat(trainer.optimizer.state_dict())
        save_tensors(tmp / "optimizer.safetensors", tensors)
        write_json(tmp / "optimizer.json", meta_opt)
        write_json(tmp / "state.json", {"step": step,
                                             "world_size": trainer.world,
                                             "calls": trainer.calls.state(),
                                             "advantage_state": trainer.adv_state,
                                             "config": to_dict(trainer.cfg)})
        final = commit(tmp, trainer.cfg.run.keep_checkpoints)
    trainer.acc.wait_for_everyone()
    return final


def load_trainer(trainer: Trainer, folder: Path) -> None:
    """Continue from checkpoint ``folder``: weights, optimizer, EMA, RNG, epoch."""
    state = read_json(folder / "state.json")
    weights = load_file(str(folder / "trainable.safetensors"))
    model = unwrap(trainer.adapter.transformer)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n in names if n not in weights]
    if missing:
        raise ValueError(f"checkpoint {folder} does not match this model; "
                         f"missing {missing[:3]}")
    with torch.no_grad():
        for name, p in zip(names, trainer.params):
            p.copy_(weights[name])
    trainer.optimizer.load_state_dict(optimizer_from_flat(
        load_file(str(folder / "optimizer.safetensors")),
        read_json(folder / "optimizer.json")))
    if trainer.ema is not None and (folder / "ema.safetensors").is_file():
        trainer.ema.load_state_dict(load_file(str(folder / "ema.safetensors")))
    load_rng(folder, trainer.rank)
    trainer.start_epoch = int(state["step"])  # one epoch per step
    trainer.calls.load(state.get("calls", {}))
    trainer.adv_state.update(state.get("advantage_state", {}))
    if (folder / "objective.safetensors").is_file():
        trainer.objective.load_state_dict(load_file(str(folder / "objective.safetensors")))
    if trainer.acc.is_main_process:
        print(f"resuming from {folder} at step {trainer.start_epoch}")


def find_checkpoint(resume: str, output_dir: str) -> Path | None:
    """Resolve ``--resume`` (``auto``, a run folder or a checkpoint folder) to a checkpoint."""
    if resume != "auto":
        path = Path(resume)
        if (path / "state.json").is_file():
            return path
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"--resume {resume}: no checkpoint found there")
        return found
    if output_dir:
        return latest_checkpoint(output_dir)
    runs = sorted(Path("runs").glob("*"), key=lambda p: p.stat().st_mtime) if Path(
        "runs").is_dir() else []
    for run in reversed(runs):
        found = latest_checkpoint(run)
        if found is not None:
            return found
    return None
