"""The shipped discrete toy (configs/digits_discrete.yaml, the ``digits_discrete`` family): its
model folders load under their short names, GRPO through the CLI raises its eval reward with
dflow_grpo and with udm_grpo, a resume is exact and two processes compute the run of one."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import pipelines
from flowgrpo.cli.main import main
from flowgrpo.config.io import load_config
from flowgrpo.run.tracking import read_metrics
from flowgrpo.training.hub import resolve_path
from flowgrpo.training.trainer import Trainer
from helpers import ROOT
from helpers.toy import stable, weights
from pipelines.digits_discrete import LEVELS, token_path
from pipelines.toy import DIGITS_DISCRETE_MODELS

CONFIG = str(ROOT / "configs" / "digits_discrete.yaml")
JOB = str(ROOT / "tests" / "helpers" / "discrete_equal_job.py")
QUIET = ["run.tensorboard=false", "run.progress=false"]
NAMES = {"digits_discrete": "masked", "digits_discrete_masked": "masked",
         "digits_discrete_uniform": "uniform", "digits_discrete_metric": "metric"}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_shipped_folder_loads_by_its_name_and_gives_logits_of_its_path(name):
    kind = NAMES[name]
    folder = resolve_path(name)
    assert folder == DIGITS_DISCRETE_MODELS[kind] and Path(folder).is_dir()
    if not (Path(folder) / "model.safetensors").is_file():
        pytest.skip(f"{folder} is not built (scripts/make_digits_discrete_model.py)")
    adapter = pipelines.load("digits_discrete", folder)
    assert adapter.path.kind == kind
    states = token_path(kind).num_states
    assert states == LEVELS + (kind == "masked")
    x = adapter.path.source((3, 64), torch.Generator().manual_seed(0))
    cond = adapter.encode(["a handwritten digit 3", "a handwritten digit 7", "a digit"])
    logits = adapter.logits(x, torch.full((3,), 0.5), cond, 1.0)
    assert logits.shape == (3, 64, states) and torch.isfinite(logits).all()
    guided = adapter.logits(x, torch.full((3,), 0.5), cond, 3.0)
    assert guided.shape == logits.shape and not torch.equal(guided, logits)  # the label matters


def test_the_package_data_ships_every_toy_folder():
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["pipelines"]
    toy = ROOT / "pipelines" / "toy"
    files = [p.relative_to(ROOT / "pipelines").as_posix() for folder in toy.iterdir()
             if folder.is_dir() and folder.name != "__pycache__"
             for p in folder.rglob("*") if p.is_file()]
    assert any(f.startswith("toy/digits-discrete-masked/") for f in files)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g.replace("**/", "")) or
                                           fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"add to pyproject's package-data: {missing}"


def _eval(run: Path) -> list[float]:
    return [r["eval/reward"] for r in read_metrics(run) if "eval/reward" in r]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["dflow_grpo", "udm_grpo"])
def test_grpo_from_the_cli_raises_the_eval_reward(tmp_path, objective):
    run = tmp_path / "run"
    code = main(["train", CONFIG, "-q", *(a for o in [f"run.output_dir={run}", *QUIET,
                                                      f"train.objective={objective}",
                                                      "run.epochs=30", "run.eval_every=30",
                                                      "run.save_every=0"]
                                          for a in ("--set", o))])
    assert code == 0
    base, final = _eval(run)
    assert 0.1 < base < 0.9  # the base model: above chance, with room to rise
    assert final > base + 0.05, (base, final)


def _config(run: Path, *overrides: str):
    return load_config(CONFIG, [f"run.output_dir={run}", *QUIET, "train.batch_size=16",
                                "train.group_size=4", "sampler.num_steps=6", "run.eval_every=2",
                                "run.save_every=1", "data.eval_images_per_prompt=1",
                                *overrides])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["dflow_grpo", "udm_grpo"])
def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, objective):
    chosen = f"train.objective={objective}"
    whole = Trainer.from_config(_config(tmp_path / "whole", "run.epochs=4", chosen))
    whole.train()
    half = tmp_path / "half"
    Trainer.from_config(_config(half, "run.epochs=2", chosen)).train()
    resumed = Trainer.from_config(_config(half, "run.epochs=4", chosen), resume="auto")
    assert resumed.start_epoch == 2
    resumed.train()
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))
    assert stable(read_metrics(half)) == stable(read_metrics(tmp_path / "whole"))
    assert any(not torch.equal(a, b) for a, b in
               zip(weights(whole), weights(Trainer.from_config(_config(tmp_path / "new")))))


def _job(out: Path, batch: int, processes: int = 1) -> subprocess.CompletedProcess:
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no",
                   "--dynamo_backend", "no", "--main_process_port", "29531"]
    proc = subprocess.run([*launch, JOB, str(out), str(batch)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_one_process_equals_two_processes(tmp_path):
    _job(tmp_path / "one", 16)
    proc = _job(tmp_path / "two", 8, processes=2)
    assert "flowgrpo: 2 processes, DDP, cpu" in proc.stdout
    a = load_file(str(tmp_path / "one" / "record.safetensors"))
    b = load_file(str(tmp_path / "two" / "record.safetensors"))
    assert int(a.pop("world")) == 1 and int(b.pop("world")) == 2
    assert sorted(a) == sorted(b)
    for key in sorted(a):
        if key.endswith((".groups", ".source", ".final")):  # tokens: drawn alike, bitwise equal
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0, msg=key)
    assert any(a[k].abs().max() > 0 for k in a if k.startswith("weight.") and "lora_B" in k)
    assert a["1.advantages"].abs().max() > 0.1  # the update had a signal
    shutil.rmtree(tmp_path)
