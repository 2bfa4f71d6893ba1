"""Test-only hooks that a ``flowgrpo`` subprocess installs at start-up when this folder is on
its ``PYTHONPATH`` (Python imports ``sitecustomize`` by itself); nothing enters the package.

The processes a test cannot reach into (the ``flowgrpo train`` that ``flowgrpo ablate``
spawns, a run stopped by a signal at a chosen point) read what to do from the environment,
which ``flowgrpo ablate`` passes on to each cell:

- ``FLOWGRPO_TEST_GATE=DIR``, ``FLOWGRPO_TEST_GATE_RUN=RUN``, ``FLOWGRPO_TEST_GATE_EPOCH=E``:
  the trainer of run folder ``RUN`` writes ``DIR/held`` (holding its process id) before epoch
  ``E`` and waits until ``DIR/open`` exists, so a kill always finds that run still going. A
  SIGINT or SIGTERM while it waits acts as one during the epoch before (a checkpoint of the
  epochs done, one line, exit 130 or 143); before the first epoch it acts as one during it.
- ``FLOWGRPO_TEST_SIGNAL=eval:N`` sends this process SIGTERM inside the eval of step ``N``,
  between generating the images and scoring them; ``FLOWGRPO_TEST_SIGNAL=write:N`` sends it
  inside the write of checkpoint ``step_N``, after its files and manifest are written and
  before the folder is renamed into place.
"""

from __future__ import annotations

import importlib.abc
import os
import signal
import sys
import time
from pathlib import Path


def install_gate(trainer_module) -> None:
    gate = Path(os.environ["FLOWGRPO_TEST_GATE"])
    run = Path(os.environ["FLOWGRPO_TEST_GATE_RUN"]).resolve()
    at = int(os.environ.get("FLOWGRPO_TEST_GATE_EPOCH", "0"))
    trainer = trainer_module.Trainer
    epoch = trainer.epoch

    def gated(self, index: int, bar) -> dict:
        if index == at and Path(self.run_dir).resolve() == run:
            (gate / "held").write_text(str(os.getpid()))
            while not (gate / "open").exists() and not self.stop_signal:
                time.sleep(0.01)
            if index:
                self.check_signals(index)  # raises when a signal came while held
        return epoch(self, index, bar)

    trainer.epoch = gated


def signal_inside(where: str, step: int, evaluation, checkpoint) -> None:
    def stop() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    if where == "eval":
        generate, run = evaluation.generate, evaluation.Evaluator.run

        def run_at(self, at: int) -> dict:
            def generate_then_stop(*args, **kwargs):
                media = generate(*args, **kwargs)
                if at == step:
                    stop()
                return media

            evaluation.generate = generate_then_stop
            try:
                return run(self, at)
            finally:
                evaluation.generate = generate

        evaluation.Evaluator.run = run_at
    elif where == "write":
        manifest = checkpoint.write_manifest

        def manifest_then_stop(folder: Path) -> None:
            manifest(folder)
            if folder.name == f".tmp_step_{step}":
                stop()

        checkpoint.write_manifest = manifest_then_stop
    else:
        raise ValueError(f"FLOWGRPO_TEST_SIGNAL: unknown place {where!r} (eval, write)")


def installed(modules) -> None:
    if "FLOWGRPO_TEST_GATE" in os.environ:
        install_gate(modules["flowgrpo.training.trainer"])
    if os.environ.get("FLOWGRPO_TEST_SIGNAL"):
        where, _, step = os.environ["FLOWGRPO_TEST_SIGNAL"].partition(":")
        signal_inside(where, int(step), modules["flowgrpo.training.evaluation"],
                      modules["flowgrpo.run.checkpoint"])


class AfterTrainer(importlib.abc.MetaPathFinder):
    """Installs the hooks once ``flowgrpo.training.trainer`` (which imports the evaluation and
    checkpoint modules) has been imported, so a process that never trains pays nothing."""

    name = "flowgrpo.training.trainer"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module) -> None:
            exec_module(module)
            installed(sys.modules)

        loader.exec_module = exec_then_install
        return spec


if "FLOWGRPO_TEST_GATE" in os.environ or os.environ.get("FLOWGRPO_TEST_SIGNAL"):
    sys.meta_path.insert(0, AfterTrainer())
