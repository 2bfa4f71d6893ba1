"""``flowgrpo ablate``: a grid of runs, resumable, with a table and plots; presets as one axis."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flowgrpo.cli import ablate as ablate_lib
from flowgrpo.cli.main import main
from flowgrpo.errors import ConfigError
from flowgrpo.run import checkpoint as ckpt
from flowgrpo.run.tracking import read_metrics
from helpers.hooks import hooked

TINY = ["train.batch_size=8", "train.group_size=4", "sampler.num_steps=4", "run.epochs=2",
        "run.eval_every=1", "run.save_every=1", "data.eval_images_per_prompt=1",
        "run.tensorboard=false", "run.progress=false"]


def test_values_split_outside_brackets_and_quotes():
    assert ablate_lib.split_values("1e-4, {size: 2, strategy: random},[1, 2],'a,b'") == [
        "1e-4", "{size: 2, strategy: random}", "[1, 2]", "'a,b'"]
    assert ablate_lib.parse_grid(["train.step_selection_params={size: 2},{size: 3}"]) == {
        "train.step_selection_params": [{"size": 2}, {"size": 3}]}


def test_a_preset_expands_to_its_overrides(tmp_path):
    cells = ablate_lib.plan(None, {"method": ["nft", "flow_grpo"]}, TINY, 2, tmp_path,
                            ablate_lib.load_presets())
    assert [(c.name, c.seed) for c in cells] == [("method=nft", 0), ("method=nft", 1),
                                                 ("method=flow_grpo", 0), ("method=flow_grpo", 1)]
    nft = yaml.safe_load(cells[1].config_file.read_text())
    assert nft["train"]["objective"] == "nft" and nft["sampler"]["name"] == "ode"
    assert nft["sampler"]["params"] == {} and nft["run"]["seed"] == 1
    assert nft["train"]["batch_size"] == 8  # --set values stay under the preset
    assert nft["run"]["output_dir"] == str(tmp_path / "method=nft" / "s1")
    base = yaml.safe_load(cells[2].config_file.read_text())
    assert base["train"]["objective"] == "ratio" and base["sampler"]["name"] == "sde"


def test_every_shipped_preset_is_a_valid_config(tmp_path):
    presets = ablate_lib.load_presets()
    cells = ablate_lib.plan(None, {"method": list(presets)}, TINY, 1, tmp_path, presets)
    assert len(cells) == len(presets) >= 20
    levers = ablate_lib.load_presets(ablate_lib.SHIPPED / "presets" / "levers.yaml")
    cells = ablate_lib.plan(None, {"method": list(levers)}, TINY, 1, tmp_path / "l", levers)
    assert len(cells) == len(levers) >= 6
    lean = {k: v for k, v in levers["lean"].items()}
    assert lean == presets["elbo_lean"]  # the ladder's last rung is the shipped preset


@pytest.mark.parametrize("grid,message", [
    (["method=flow_grpo,nope"], "--grid method: unknown preset 'nope'; valid: flow_grpo, "),
    (["train.lrr=1,2"], "cell train.lrr=1: unknown key train.lrr (did you mean train.lr?)"),
    (["train.lr=1e-4,-1"], "cell train.lr=-1: train.lr: invalid value -1.0"),
    (["train.lr"], "--grid 'train.lr' must look like KEY=V1,V2,..."),
])
def test_a_bad_grid_fails_at_once_with_the_valid_names(tmp_path, capsys, grid, message):
    args = ["ablate", "--out", str(tmp_path / "abl")]
    for item in grid:
        args += ["--grid", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not list(tmp_path.glob("abl/*/s0"))  # nothing ran


@pytest.mark.slow
def test_ablate_runs_the_grid_skips_finished_cells_and_resumes_a_killed_one(tmp_path):
    out = tmp_path / "abl"
    args = ["ablate", "--grid", "method=flow_grpo,flash", "--seeds", "1", "--target", "0.3",
            "--out", str(out), *[a for s in TINY for a in ("--set", s)]]
    assert main(args) == 0
    with open(out / "ablation.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["cell"] for r in rows] == ["method=flow_grpo", "method=flash"]
    assert all(r["done"] == "True" and float(r["calls_grad"]) > 0 for r in rows)
    # flash trains one step per sample: fewer training calls than the full trajectory
    assert float(rows[1]["calls_grad"]) < float(rows[0]["calls_grad"])
    table = (out / "ablation.md").read_text()
    assert "| method=flow_grpo | 1/1 |" in table and "| method=flash | 1/1 |" in table
    for name in ("eval_vs_step.png", "eval_vs_calls.png", "eval_vs_time.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a re-run skips the finished cells
    assert main(args) == 0
    for cell in ("method=flow_grpo", "method=flash"):
        attempts = (out / cell / "s0" / "attempts.jsonl").read_text().splitlines()
        assert len(attempts) == 1
    # a cell killed after its first checkpoint resumes from it
    flash = out / "method=flash" / "s0"
    final = read_metrics(flash)
    (flash / "done.json").unlink()
    shutil.rmtree(flash / "checkpoints" / "step_2")
    assert main(args) == 0
    attempts = [json.loads(a) for a in (flash / "attempts.jsonl").read_text().splitlines()]
    assert [a["resumed"] for a in attempts] == [False, True]
    assert "resuming from" in (out / "method=flash" / "s0.log").read_text()
    resumed = read_metrics(flash)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    strip = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in final]


def test_a_config_error_in_a_preset_file_names_the_preset(tmp_path):
    presets = tmp_path / "p.yaml"
    presets.write_text("broken: {train.loss: sapo, train.loss_params: {bogus: 1}}\n")
    with pytest.raises(ConfigError, match="cell method=broken: train.loss_params: .*bogus"):
        ablate_lib.plan(None, {"method": ["broken"]}, TINY, 1, tmp_path,
                        ablate_lib.load_presets(presets))


@pytest.mark.parametrize("level, flags", [("QUIET", ["--quiet"]), ("NORMAL", []),
                                          ("VERBOSE", ["--verbose"])])
def test_a_cell_runs_at_the_command_s_console_level(tmp_path, monkeypatch, level, flags):
    import subprocess

    from flowgrpo import console
    from flowgrpo.cli import ablate as ablate_lib

    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(ablate_lib.subprocess, "run", fake_run)
    console.configure(getattr(console, level))
    cell = ablate_lib.Cell("c", {}, 0, tmp_path / "cell" / "s0")
    assert ablate_lib.run_cell(cell, threads=1) is None
    assert seen[0][-len(flags) - 1:] == [str(cell.config_file), *flags]


@pytest.mark.slow
def test_every_discrete_preset_is_a_valid_config_of_the_discrete_toy(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    presets = ablate_lib.load_presets(root / "configs" / "presets" / "discrete.yaml")
    cells = ablate_lib.plan(root / "configs" / "digits_discrete.yaml",
                            {"method": list(presets)}, [], 1, tmp_path, presets)
    assert len(cells) == len(presets)
    from flowgrpo.config.io import from_dict, read_config
    from flowgrpo.training.trainer import Trainer

    objectives = set()
    for cell in cells:  # each builds its trainer: the objective checks the model's token path
        trainer = Trainer.from_config(from_dict(read_config(cell.config_file)), overwrite=True)
        objectives.add(type(trainer.objective).__name__)
        model = presets[cell.values["method"]]["model.path"]  # digits_discrete_<path>
        assert trainer.adapter.path.kind == model.rsplit("_", 1)[1]
    assert objectives == {"DFlowGRPO", "UdmGRPO"}


# ----------------------------------------------------------------------------- kills
KILL_GRID = ["--grid", "train.lr=0.0001,0.0002", "--seeds", "1"]
FIRST, SECOND = "train.lr=0.0001", "train.lr=0.0002"


def ablate_command(out: Path) -> list[str]:
    return [sys.executable, "-m", "flowgrpo.cli", "ablate", *KILL_GRID, "--out", str(out),
            *[a for s in TINY for a in ("--set", s)]]


def held_ablation(out: Path, gate: Path, epoch: int) -> tuple[subprocess.Popen, int]:
    """``flowgrpo ablate`` in a process group of its own, its second cell held before
    ``epoch``; returns the process and the held cell's process id, once it waits."""
    gate.mkdir()
    env = hooked(FLOWGRPO_TEST_GATE=gate, FLOWGRPO_TEST_GATE_RUN=out / SECOND / "s0",
                 FLOWGRPO_TEST_GATE_EPOCH=epoch)
    proc = subprocess.Popen(ablate_command(out), env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (gate / "held").is_file() or not (gate / "held").read_text():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the second cell never reached the gate"
        time.sleep(0.02)
    return proc, int((gate / "held").read_text())


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def assert_finished_once(out: Path, resumed: bool) -> None:
    """The re-run skipped the finished first cell, ran the second once more and wrote one done
    row per cell and seed."""
    first = (out / FIRST / "s0" / "attempts.jsonl").read_text().splitlines()
    assert len(first) == 1  # skipped, not run again
    attempts = [json.loads(a) for a in
                (out / SECOND / "s0" / "attempts.jsonl").read_text().splitlines()]
    assert [(a["resumed"], a["returncode"]) for a in attempts][-1] == (resumed, 0)
    for cell in (FIRST, SECOND):
        assert [r["step"] for r in read_metrics(out / cell / "s0")] == [0, 1, 2]
        assert json.loads((out / cell / "s0" / "done.json").read_text())["attempts"] >= 1
    with open(out / "ablation.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["cell"], r["seed"], r["done"], r["steps"]) for r in rows] == [
        (FIRST, "0", "True", "2"), (SECOND, "0", "True", "2")]


@pytest.mark.slow
@pytest.mark.parametrize("epoch", [1, 0], ids=["after-a-checkpoint", "before-any-checkpoint"])
def test_sigkill_of_the_ablation_s_process_group_then_the_same_command_finishes(tmp_path,
                                                                                  epoch):
    out, gate = tmp_path / "abl", tmp_path / "gate"
    proc, child = held_ablation(out, gate, epoch)
    os.killpg(proc.pid, signal.SIGKILL)  # the ablation and the cell it runs, at once
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (out / FIRST / "s0" / "done.json").is_file()
    second = out / SECOND / "s0"
    assert not (second / "done.json").exists() and not (second / "attempts.jsonl").exists()
    assert [p.name for p in ckpt.checkpoint_dirs(second)] == [f"step_{e}" for e in
                                                              range(1, epoch + 1)]
    rerun = subprocess.run(ablate_command(out), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert "(1 done, 1 to run" in rerun.stdout
    log = (out / SECOND / "s0.log").read_text()
    assert ("resuming from" in log) == bool(epoch)  # else it started over with --overwrite
    assert_finished_once(out, resumed=bool(epoch))
    assert not alive(child)


@pytest.mark.slow
def test_sigkill_of_the_ablation_alone_stops_its_cell_then_the_same_command_finishes(tmp_path):
    out, gate = tmp_path / "abl", tmp_path / "gate"
    proc, child = held_ablation(out, gate, 1)
    try:
        proc.kill()  # the ablation only: its cell must not live on, waiting or training
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 120
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the cell of a killed ablation is still running"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
    log = (out / SECOND / "s0.log").read_text()
    assert log.strip().splitlines()[-1] == (
        "flowgrpo: stopped by SIGTERM after step 1; checkpoint step_1 written; continue with "
        "--resume auto")
    rerun = subprocess.run(ablate_command(out), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert_finished_once(out, resumed=True)


def test_a_torn_attempts_line_or_done_file_of_a_killed_ablation_does_not_stop_the_re_run(
        tmp_path, monkeypatch):
    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(ablate_lib.subprocess, "run", fake_run)
    cell = ablate_lib.Cell("c", {}, 0, tmp_path / "cell" / "s0")
    cell.folder.mkdir(parents=True)
    (cell.folder / "attempts.jsonl").write_text('{"wall_s": 2.0, "returncode": 0, "resu')
    (cell.folder / "done.json").write_text('{"wall_s": 2.')  # killed while writing it
    assert not cell.done
    assert ablate_lib.run_cell(cell, threads=1) is None
    lines = (cell.folder / "attempts.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["returncode"] == 0
    assert cell.done and json.loads((cell.folder / "done.json").read_text())["attempts"] == 1
    ablate_lib.summarize(tmp_path, [cell], [], None)
    with open(tmp_path / "ablation.csv") as f:
        assert [r["done"] for r in csv.DictReader(f)] == ["True"]
