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
  of it), the time it was saved, the world size, the running counters and the config;
- ``manifest.json``, written last: every file's size and SHA-256.

A checkpoint is first written to a temporary sibling folder and then renamed, so a crash never
leaves a half-written ``step_<N>``; a file damaged later is found by :func:`verify`, and a resume
falls back to the newest intact checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from flowgrpo import distributed as engines
from flowgrpo.distributed import unwrap
from flowgrpo.errors import RunError
from flowgrpo.rl.session import ModelSession

MANIFEST = "manifest.json"


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Every published ``step_<N>`` folder of a run, oldest first, intact or not (see
    :func:`verify`); the temporary folders of unfinished writes are not listed."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")
             and p.name.removeprefix("step_").isdigit()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step_")))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file's size and SHA-256 in ``manifest.json``, written last."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    write_json(folder / MANIFEST, {"files": files})


def verify(folder: str | Path) -> str | None:
    """What is wrong with checkpoint ``folder`` (one line naming the bad file), or None when
    every file the manifest lists is there with its size and hash."""
    folder = Path(folder)
    try:
        files = read_json(folder / MANIFEST)["files"]
    except FileNotFoundError:
        return f"{folder / MANIFEST} is missing (the checkpoint was never completed)"
    except (ValueError, KeyError, TypeError):
        return f"{folder / MANIFEST} is not a valid manifest"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != entry["size"]:
            return f"{path} is damaged ({path.stat().st_size} bytes, {entry['size']} written)"
        if _sha256(path) != entry["sha256"]:
            return f"{path} is damaged (its content does not match the hash written with it)"
    if "state.json" not in files:
        return f"{folder / 'state.json'} is missing"
    return None


def intact_checkpoint(run_dir: str | Path, warn: Callable[[str], None] | None = None
                      ) -> Path | None:
    """The newest intact checkpoint of a run; each damaged newer one is passed to ``warn``."""
    for folder in reversed(checkpoint_dirs(run_dir)):
        problem = verify(folder)
        if problem is None:
            return folder
        if warn is not None:
            warn(f"skipping damaged checkpoint {folder.name}: {problem}")
    return None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest intact checkpoint of a run (None when there is none)."""
    return intact_checkpoint(run_dir)


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
    """Write the manifest, atomically publish ``tmp`` as ``step_<N>`` and delete all but the
    newest ``keep`` checkpoints."""
    write_manifest(tmp)
    final = tmp.with_name(tmp.name.removeprefix(".tmp_"))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in checkpoint_dirs(final.parent.parent)[:-keep]:
        shutil.rmtree(old)
    return final


def remove_leftovers(run_dir: str | Path) -> list[Path]:
    """Delete the temporary folders of checkpoint writes that never finished; returns them."""
    root = Path(run_dir) / "checkpoints"
    leftovers = sorted(root.glob(".tmp_step_*")) if root.is_dir() else []
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def save(run_dir: Path, step: int, acc: Any, session: ModelSession,
         state: Callable[[bool], dict[str, Any]], keep: int) -> Path | None:
    """Write checkpoint ``step`` of ``run_dir`` atomically.

    Args:
        acc: the accelerate ``Accelerator``.
        session: the model session (the LoRA folder or the model's own files are written
            through it).
        state: ``state(full_model)``: what the checkpoint holds, built by each owner as whole CPU
            tensors (see :func:`write`); under FSDP2 building it is a collective of every
            process, else only the main process builds it.
        keep: how many checkpoints stay.

    A failed write (a full disk) removes the temporary folder, leaves the earlier checkpoints
    as they were and raises :class:`~flowgrpo.errors.RunError` on every process."""
    from accelerate.utils import broadcast_object_list

    run_dir = Path(run_dir)
    acc.wait_for_everyone()
    tmp = run_dir / "checkpoints" / f".tmp_step_{step}"
    # whole tensors from every engine; under FSDP2 gathering is a collective of every process
    sharded = engines.any_sharded(unwrap(session.adapter.transformer))
    payload = state(sharded) if sharded or acc.is_main_process else None
    if acc.is_main_process:
        begin(run_dir, step)
    acc.wait_for_everyone()
    failure = None
    try:
        save_rng(tmp, acc.process_index)
    except OSError as err:
        failure = err
    acc.wait_for_everyone()
    final = None
    if acc.is_main_process:
        try:
            if failure is None:
                final = write(tmp, session, payload, keep)
        except OSError as err:
            failure = err
        if failure is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    failure = broadcast_object_list([None if failure is None else _describe(failure)])[0]
    if failure is not None:
        raise RunError(f"checkpoint step_{step} was not written: {failure}; the earlier "
                       f"checkpoints in {run_dir / 'checkpoints'} are intact")
    return final


def _describe(err: OSError) -> str:
    if err.errno == errno.ENOSPC:
        return "no space left on the device"
    return err.strerror or str(err)


def write(tmp: Path, session: ModelSession, payload: dict[str, Any], keep: int) -> Path:
    """Write ``payload`` into ``tmp`` and publish it (:func:`commit`).

    ``payload`` holds ``weights`` (:meth:`ModelSession.state_dict`), ``ema`` (or None),
    ``objective`` (its snapshots, maybe empty), ``optimizer`` (a torch optimizer state dict) and
    ``state``, the JSON part (the step, the world size, the owners' counters, the config)."""
    weights = payload["weights"]
    model = unwrap(session.adapter.transformer)
    if weights["lora"] is not None:
        meta = model.peft_config["default"].to_dict()
        meta["target_modules"] = sorted(meta["target_modules"])
        session.adapter.save_lora(str(tmp / "lora"), weights["lora"], meta)
    elif weights["model"] is not None:  # sharded full fine-tuning: the gathered weights
        (tmp / "transformer").mkdir()
        save_tensors(tmp / "transformer" / "diffusion_pytorch_model.safetensors",
                     weights["model"])
        model.save_config(str(tmp / "transformer"))
    elif hasattr(model, "save_pretrained"):
        model.save_pretrained(str(tmp / "transformer"))
    save_tensors(tmp / "trainable.safetensors", weights["trainable"])
    if payload["ema"] is not None:
        save_tensors(tmp / "ema.safetensors", payload["ema"])
    if payload["objective"]:  # e.g. DiffusionNFT's old policy
        save_tensors(tmp / "objective.safetensors", payload["objective"])
    tensors, meta_opt = optimizer_to_flat(payload["optimizer"])
    save_tensors(tmp / "optimizer.safetensors", tensors)
    write_json(tmp / "optimizer.json", meta_opt)
    state = dict(payload["state"])
    write_json(tmp / "state.json", {"step": state.pop("step"), "saved_at": time.time(), **state})
    return commit(tmp, keep)


def read(folder: Path) -> dict[str, Any]:
    """What checkpoint ``folder`` holds, in :func:`write`'s layout: ``weights`` (``trainable``
    only), ``ema`` and ``objective`` (None when absent), ``optimizer`` and ``state``. The RNG
    states are per process: :func:`load_rng`."""
    folder = Path(folder)

    def optional(name: str) -> dict[str, torch.Tensor] | None:
        path = folder / name
        return load_file(str(path)) if path.is_file() else None

    return {
        "weights": {"trainable": load_file(str(folder / "trainable.safetensors"))},
        "ema": optional("ema.safetensors"),
        "objective": optional("objective.safetensors"),
        "optimizer": optimizer_from_flat(load_file(str(folder / "optimizer.safetensors")),
                                         read_json(folder / "optimizer.json")),
        "state": read_json(folder / "state.json"),
    }


def saved_config(folder: str | Path) -> dict:
    """The config a checkpoint was written with, as a nested dict."""
    return read_json(Path(folder) / "state.json")["config"]


def find_checkpoint(resume: str, output_dir: str,
                    warn: Callable[[str], None] | None = None) -> Path:
    """Resolve ``--resume`` to an intact checkpoint folder, or raise a one-line
    :class:`~flowgrpo.errors.RunError`.

    - a checkpoint folder: used as it is, when it is intact;
    - a run folder, or ``auto`` with ``run.output_dir`` set: its newest intact checkpoint;
      damaged newer ones are skipped, each passed to ``warn``;
    - ``auto`` without ``run.output_dir``: the run under ``runs/`` whose newest checkpoint was
      saved last (by the time the checkpoint records, not by folder times).
    """
    if resume != "auto":
        path = Path(resume)
        if (path / MANIFEST).is_file() or (path / "state.json").is_file():
            problem = verify(path)
            if problem is not None:
                raise RunError(f"--resume {resume}: {problem}")
            return path
        run = path
    elif output_dir:
        run = Path(output_dir)
    else:
        run = newest_run(Path("runs"))
        if run is None:
            raise RunError("--resume auto: no run under runs/ has a checkpoint (set "
                           "run.output_dir, or start without --resume)")
    if not run.is_dir():
        raise RunError(f"--resume {resume}: {run} does not exist")
    skipped: list[str] = []  # told only when an intact one is used; else the error says it
    found = intact_checkpoint(run, skipped.append)
    for message in skipped if found is not None and warn is not None else []:
        warn(message)
    if found is None:
        damaged = checkpoint_dirs(run)
        raise RunError(f"--resume {resume}: {run} has no intact checkpoint"
                       + (f" ({verify(damaged[-1])})" if damaged else
                          " yet (start it without --resume, or wait for its first save)"))
    return found


def newest_run(root: Path) -> Path | None:
    """The run under ``root`` whose newest checkpoint records the latest save time."""
    best, best_time = None, float("-inf")
    for run in sorted(root.iterdir()) if root.is_dir() else []:
        for folder in reversed(checkpoint_dirs(run)):
            try:
                saved_at = float(read_json(folder / "state.json").get("saved_at", 0))
            except (OSError, ValueError):
                continue
            if saved_at > best_time:
                best, best_time = run, saved_at
            break
    return best
