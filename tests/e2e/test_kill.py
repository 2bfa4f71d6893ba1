"""Exact resume through the CLI: SIGKILL at random points (between epochs, inside epochs and
inside checkpoint writes), then ``--resume auto``, ends with the trainable weights and metrics
rows of an uninterrupted run; SIGINT and SIGTERM checkpoint, print one line and exit 130/143.

The interrupted runs go through ``helpers/gated_train.py``: each holds before its last epoch
until the test opens the gate, so a kill or a signal always finds the run still going (no
sleep has to land before the run ends), and each waits for a checkpoint of its own first, so
every start after a kill resumes."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowgrpo.run import checkpoint as ckpt
from flowgrpo.run.tracking import read_metrics
from helpers import ROOT
from helpers.hooks import hooked
from helpers.toy import stable

GATED = str(ROOT / "tests" / "helpers" / "gated_train.py")

EPOCHS = 8
SETTINGS = ["train.batch_size=8", "train.group_size=4", "sampler.num_steps=4",
            "data.eval_images_per_prompt=1", "run.tensorboard=true", "run.progress=false",
            f"run.epochs={EPOCHS}", "run.eval_every=3", "run.save_every=1"]


def command(run: Path, *extra: str, gate: Path | None = None) -> list[str]:
    """``flowgrpo train`` of the job into ``run``; held before its last epoch at ``gate``."""
    sets = [a for s in SETTINGS for a in ("--set", s)]
    launch = ["-m", "flowgrpo.cli"] if gate is None else [GATED, str(gate)]
    return [sys.executable, *launch, "train", *sets, "--set", f"run.output_dir={run}", *extra]


def start(run: Path, gate: Path) -> subprocess.Popen:
    """Continue the run when it has a checkpoint, else start it afresh; held at ``gate`` until
    ``gate/open`` exists."""
    gate.mkdir(exist_ok=True)
    (gate / "held").unlink(missing_ok=True)
    extra = ("--resume", "auto") if ckpt.latest_checkpoint(run) else ("--overwrite",)
    return subprocess.Popen(command(run, *extra, gate=gate), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def saved(run: Path) -> set[str]:
    """The checkpoints committed so far (one appears by an atomic rename of its folder)."""
    return {p.name for p in (run / "checkpoints").glob("step_*")}


def wait_for_progress(proc: subprocess.Popen, run: Path, gate: Path, before: set[str]) -> None:
    """Until the process committed a checkpoint it did not start with, so that every later
    start resumes, or waits at the gate (or ended)."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and saved(run) == before and not (gate / "held").exists():
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{EPOCHS}" / "trainable.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("uninterrupted")
    proc = subprocess.run(command(run), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return final_weights(run), stable(read_metrics(run))


def assert_same_run(run: Path, uninterrupted) -> None:
    weights, rows = uninterrupted
    got = final_weights(run)
    assert sorted(got) == sorted(weights)
    assert all(torch.equal(got[k], weights[k]) for k in weights)  # bitwise
    assert stable(read_metrics(run)) == rows  # one row per step, the same values


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_exact(tmp_path, uninterrupted):
    rng = random.Random(0)
    run, gate, kills = tmp_path / "run", tmp_path / "gate", 0
    while True:
        before = saved(run)
        if kills == 4:
            gate.mkdir(exist_ok=True)
            (gate / "open").touch()  # the last start runs to the end
        proc = start(run, gate)
        if kills < 4:
            wait_for_progress(proc, run, gate, before)
            time.sleep(rng.uniform(0.0, 0.6))  # a random point of an epoch or of a save
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
                kills += 1
                continue
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        break
    assert kills == 4
    assert_same_run(run, uninterrupted)
    assert len((run / "resumes.jsonl").read_text().splitlines()) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_checkpoints_prints_one_line_and_resumes_exactly(tmp_path, uninterrupted,
                                                                  sig, code):
    run, gate = tmp_path / "run", tmp_path / "gate"
    before = saved(run)
    proc = start(run, gate)
    wait_for_progress(proc, run, gate, before)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    name = signal.Signals(sig).name
    assert last.startswith(f"flowgrpo: stopped by {name} after step ")
    step = int(last.split("after step ")[1].split(";")[0])
    assert last.endswith(f"checkpoint step_{step} written; continue with --resume auto")
    assert step < EPOCHS and ckpt.latest_checkpoint(run).name == f"step_{step}"
    (gate / "open").touch()
    proc = start(run, gate)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert_same_run(run, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("where,at,stopped", [
    ("eval", 3, 3),   # the eval of step 3: the epoch's row and checkpoint, then the stop
    ("eval", 0, 1),   # the base eval: the first epoch runs, is saved, then the stop
    ("write", 2, 2),  # checkpoint step_2 written but not yet renamed into place
    ("write", EPOCHS, EPOCHS),  # the last checkpoint: the resume has nothing left to do
])
def test_sigterm_inside_an_eval_or_a_checkpoint_write_then_resume_is_exact(
        tmp_path, uninterrupted, where, at, stopped):
    run = tmp_path / "run"
    proc = subprocess.run(command(run), capture_output=True, text=True, timeout=600,
                          env=hooked(FLOWGRPO_TEST_SIGNAL=f"{where}:{at}"))
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert err[-1] == (f"flowgrpo: stopped by SIGTERM after step {stopped}; checkpoint "
                       f"step_{stopped} written; continue with --resume auto"), err
    assert [p.name for p in ckpt.checkpoint_dirs(run)][-1] == f"step_{stopped}"
    assert ckpt.verify(run / "checkpoints" / f"step_{stopped}") is None
    assert not list((run / "checkpoints").glob(".tmp_*"))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(stopped + 1))  # each step once, none lost
    assert all("eval/reward" in r for r in rows if r["step"] % 3 == 0)
    proc = subprocess.run(command(run, "--resume", "auto"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(run, uninterrupted)
