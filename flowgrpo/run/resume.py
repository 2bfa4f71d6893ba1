"""What a run folder promises: a fresh run never overwrites one by accident, and a resume
continues the same run.

- :func:`guard_fresh`: a folder that holds checkpoints or metrics is refused without
  ``--resume`` (or emptied with ``--overwrite``).
- :func:`check_config`: a resume keeps the checkpoint's config; only the keys in
  :data:`HARMLESS` (length, cadence, eval and logging) may change, and the per-process sizes
  may change only with the world size, keeping the global batch.
- :func:`truncate_metrics`: the rows after the checkpoint's step are cut before anything is
  appended, so every step has exactly one row.
- :func:`record`: each resume is appended to ``RUN/resumes.jsonl`` next to ``config.yaml``,
  which keeps the config the run started with.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowgrpo.config.io import from_dict, layer, load_config, parse_override, to_dict
from flowgrpo.config.schema import Config
from flowgrpo.errors import RunError
from flowgrpo.run.checkpoint import checkpoint_dirs

# changing these does not change what the run computes, only how long it runs, when it
# evaluates and saves, what eval measures and how it reports
HARMLESS = frozenset({
    "run.epochs", "run.eval_every", "run.save_every", "run.keep_checkpoints", "run.output_dir",
    "run.tensorboard", "run.wandb", "run.wandb_project", "run.progress", "run.cpu",
    "run.on_reward_error", "run.on_nonfinite", "run.max_nonfinite_steps", "run.reward_retries",
    "data.eval_prompts", "data.eval_images_per_prompt", "sampler.eval_num_steps",
    "reward.async_workers", "model.offload_encoders",
})
# sizes per process: a resume on another number of processes must keep their global value
PER_PROCESS = ("train.batch_size", "train.sample_batch_size", "train.train_batch_size")
RUN_FILES = ("checkpoints", "metrics.jsonl", "tb", "samples", "config.yaml", "resumes.jsonl")


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` (dict-valued keys such as
    ``train.loss_params`` stay whole: their fields are not config keys)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and not prefix:
            out.update(flatten(value, f"{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def holds_run(run_dir: Path) -> list[str]:
    """What in ``run_dir`` belongs to an earlier run (checkpoints, metrics rows)."""
    found = []
    if checkpoint_dirs(run_dir):
        found.append("checkpoints")
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    return found


def guard_fresh(run_dir: Path, overwrite: bool, clear: bool) -> None:
    """Refuse to start a fresh run in a folder holding one, unless ``overwrite``; then (when
    ``clear``: the main process) delete the earlier run's files."""
    found = holds_run(run_dir)
    if not found:
        return
    if not overwrite:
        raise RunError(f"{run_dir} already holds a run ({' and '.join(found)}): continue it "
                       f"with --resume auto, choose a fresh run.output_dir, or pass "
                       f"--overwrite to replace it")
    if clear:
        for name in RUN_FILES:
            path = run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()


def _global(flat: dict, key: str, world: int) -> int:
    value = flat[key] or flat["train.batch_size"]  # 0: the batch size
    return int(value) * world


def check_config(saved: dict, saved_world: int, config: Config, world: int
                 ) -> dict[str, list]:
    """Refuse a resume whose config changes what the run computes.

    Returns:
        ``{key: [checkpoint value, new value]}`` for the harmless keys that change.

    Raises:
        RunError: naming the first key that changes the run's meaning, with both values.
    """
    old, new = flatten(saved), flatten(to_dict(config))
    changed = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key in PER_PROCESS:
            a, b = _global(old, key, saved_world), _global(new, key, world)
            if a == b:
                continue
            raise RunError(f"cannot resume: {key} x processes is {a} in the checkpoint "
                           f"({saved_world} process{'es' * (saved_world > 1)}) and {b} now "
                           f"({world}); keep the global batch, or start a new run")
        if a == b:
            continue
        if key not in HARMLESS:
            raise RunError(f"cannot resume: {key} is {a!r} in the checkpoint and {b!r} now; "
                           f"a resumed run keeps its meaning (start a new run to change it)")
        changed[key] = [a, b]
    return changed


def train_config(path: str | None, overrides: list[str], resume: str | None
                 ) -> tuple[Config, str | None]:
    """The config of ``flowgrpo train`` and what to resume from.

    Without a config file, a resume starts from the checkpoint's own config (plus the
    overrides), so ``flowgrpo train --resume RUN`` continues the run as it was."""
    if not resume or path:
        return load_config(path, overrides), resume
    from flowgrpo.run import checkpoint

    output_dir = ""
    for item in overrides:
        keys, value = parse_override(item)
        if keys == ["run", "output_dir"]:
            output_dir = str(value)
    folder = checkpoint.find_checkpoint(resume, output_dir, warn=warn)
    data = layer(checkpoint.saved_config(folder), overrides=overrides)
    return from_dict(data), str(folder)


def truncate_metrics(run_dir: Path, step: int) -> int:
    """Drop the ``metrics.jsonl`` rows after ``step`` (written after the checkpoint the run
    resumes from) and any torn last line; returns how many rows were dropped."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a kill
            dropped += 1
            continue
        if row.get("step", 0) <= step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_name(".metrics.jsonl.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
    return dropped


def record(run_dir: Path, folder: Path, step: int, world: int, changed: dict,
           dropped: int) -> None:
    """Append this resume to ``RUN/resumes.jsonl``."""
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "checkpoint": folder.name,
             "step": step, "world_size": world, "changed": changed, "rows_dropped": dropped}
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def warn(message: str) -> None:
    from flowgrpo import console

    console.warn(message)


@dataclass
class RunFolder:
    """Where a run writes, and what it continues from (see :meth:`open`).

    Attributes:
        path: the run folder.
        checkpoint: the checkpoint a resume continues from; None for a fresh run.
        changed: the harmless config keys a resume changes (:func:`check_config`).
        saved_world: the number of processes that wrote ``checkpoint``.
        overwrite: a fresh run replaces an earlier run's files in ``path``.
        lock: the folder's lock (:mod:`flowgrpo.run.lock`), held by the main process from
            :meth:`open` until :meth:`release`.
    """

    path: Path
    checkpoint: Path | None = None
    changed: dict = field(default_factory=dict)
    saved_world: int = 1
    overwrite: bool = False
    lock: Any = None

    def release(self) -> None:
        """Let another run write into the folder."""
        if self.lock is not None:
            self.lock.release()

    @classmethod
    def open(cls, config: Config, acc: Any, resume: str | None = None,
             overwrite: bool = False) -> RunFolder:
        """The run folder of ``config`` on every process (``acc``: the accelerate
        ``Accelerator``).

        Args:
            resume: ``None`` (fresh run), ``"auto"`` (the newest intact checkpoint of
                ``run.output_dir``, or of the run under ``runs/`` saved last) or a checkpoint /
                run folder; its config must match ``config`` but for :data:`HARMLESS` keys.
            overwrite: start a fresh run even in a folder that holds one; without it such a
                folder is refused.
        """
        from accelerate.utils import broadcast_object_list

        from flowgrpo.run import checkpoint as ckpt
        from flowgrpo.run.tracking import new_run_dir

        main = acc.is_main_process
        folder = (ckpt.find_checkpoint(resume, config.run.output_dir, warn=warn if main else None)
                  if resume else None)
        changed: dict = {}
        saved_world = 1
        if folder is not None:
            run_dir = folder.parent.parent
            state = ckpt.read_json(folder / "state.json")
            saved_world = int(state.get("world_size", 1))
            changed = check_config(state["config"], saved_world, config, acc.num_processes)
        else:
            run_dir = Path(config.run.output_dir) if config.run.output_dir else new_run_dir()
        lock, error = None, ""
        if main:  # before anything in the folder is written or deleted
            from flowgrpo.run.lock import acquire

            try:
                lock = acquire(run_dir, warn)
            except RunError as err:
                error = str(err)
        path, error = broadcast_object_list([str(run_dir), error])
        if error:  # every process stops, none waits for the others
            raise RunError(error)
        run = cls(Path(path), folder, changed, saved_world, overwrite, lock)
        if folder is None:
            try:
                guard_fresh(run.path, overwrite, clear=False)
            except RunError:
                run.release()
                raise
        return run

    def prepare(self, config: Config, step: int, world: int) -> None:
        """On the main process, before anything is written: nothing of an earlier run is lost
        or duplicated. A fresh run clears what ``overwrite`` replaces and writes
        ``config.yaml``; a resume at ``step`` cuts the later metrics rows and records itself."""
        from flowgrpo.config.io import to_yaml
        from flowgrpo.run import checkpoint as ckpt

        self.path.mkdir(parents=True, exist_ok=True)
        for leftover in ckpt.remove_leftovers(self.path):
            warn(f"removed {leftover}, an unfinished checkpoint write")
        if self.checkpoint is None:
            guard_fresh(self.path, self.overwrite, clear=True)
            (self.path / "config.yaml").write_text(to_yaml(config))
            return
        dropped = truncate_metrics(self.path, step)
        record(self.path, self.checkpoint, step, world, self.changed, dropped)
        notes = [f"changed: {', '.join(self.changed)}"] if self.changed else []
        if self.saved_world != world:
            notes.append(f"written by {self.saved_world} processes; the global batch is kept")
        from flowgrpo import console

        console.note(f"flowgrpo: resuming from {self.checkpoint} at step {step}"
                     + (f" ({'; '.join(notes)})" if notes else ""))
