"""A run folder is never silently overwritten, a resume continues the same run (one metrics row
per step, the saved config as the base, resumes recorded) and checkpoints are verified."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch

from flowgrpo.cli.main import main
from flowgrpo.config.io import load_config, to_dict
from flowgrpo.errors import RunError
from flowgrpo.run import checkpoint as ckpt
from flowgrpo.run import resume as resume_lib
from flowgrpo.run.tracking import read_metrics
from flowgrpo.training.trainer import Trainer
from helpers.toy import config, stable, weights


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An uninterrupted 3-epoch run: its weights and metrics rows."""
    run = tmp_path_factory.mktemp("finished")
    t = Trainer.from_config(config(run, "run.epochs=3"))
    t.train()
    return run, weights(t), read_metrics(run)


def test_a_fresh_run_refuses_a_folder_holding_one(finished, tmp_path):
    run, _, rows = finished
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(RunError, match="already holds a run.*--resume auto.*--overwrite"):
        Trainer.from_config(config(run, "run.epochs=3"))
    assert (run / "metrics.jsonl").read_text() == before  # nothing touched
    # --overwrite starts afresh: the earlier run's files are gone, one series of rows
    copy = tmp_path / "copy"
    Trainer.from_config(config(copy, "run.epochs=1")).train()
    Trainer.from_config(config(copy, "run.epochs=1"), overwrite=True).train()
    assert [r["step"] for r in read_metrics(copy)] == [0, 1]


def test_resume_cuts_rows_after_the_checkpoint_and_is_exact(finished, tmp_path):
    """Lose the last checkpoint (a kill between its metrics row and its save): the resume
    drops the orphan row, redoes the epoch and ends exactly where the uninterrupted run did."""
    import shutil

    run, final, rows = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step_3")
    t = Trainer.from_config(config(copy, "run.epochs=3"), resume="auto")
    assert t.start_epoch == 2
    assert [r["step"] for r in read_metrics(copy)] == [0, 1, 2]  # row 3 was cut
    t.train()
    assert stable(read_metrics(copy)) == stable(rows)  # one row per step, equal values
    assert all(torch.equal(a, b) for a, b in zip(weights(t), final))
    entry = json.loads((copy / "resumes.jsonl").read_text())
    assert entry["checkpoint"] == "step_2" and entry["rows_dropped"] == 1


def test_resume_auto_without_a_checkpoint_says_so(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(RunError, match="no intact checkpoint yet"):
        Trainer.from_config(config(tmp_path), resume="auto")


def test_the_saved_config_is_the_base_of_a_resume(finished, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    kept = (run / "config.yaml").read_text()
    with pytest.raises(RunError, match=r"model.lora_rank is 16 in the checkpoint and 4 now"):
        Trainer.from_config(config(run, "run.epochs=3", "model.lora_rank=4"), resume="auto")
    with pytest.raises(RunError, match=r"train.batch_size x processes is 8 .* and 16 now"):
        Trainer.from_config(config(run, "run.epochs=3", "train.batch_size=16"), resume="auto")
    assert (run / "config.yaml").read_text() == kept  # a failed resume changes nothing
    # without a config file the CLI resumes from the checkpoint's config plus the overrides
    code = main(["train", "--resume", str(run), "--set", "run.epochs=4"])
    assert code == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3, 4]
    assert (run / "config.yaml").read_text() == kept  # the config the run started with
    entry = json.loads((run / "resumes.jsonl").read_text().splitlines()[-1])
    assert entry["changed"] == {"run.epochs": [3, 4]}
    code = main(["train", "--resume", str(run), "--set", "train.lr=0.5"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("flowgrpo: cannot resume: train.lr is 0.001 in the checkpoint and 0.5 "
                       "now; a resumed run keeps its meaning (start a new run to change it)")


def snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("bad", ["train.lr=.inf", "train.adam_beta1=2", "model.path=/nope",
                                 "train.loss_params.bogus=1", "data.prompts=/nope.txt"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_bad_input_into_a_run_loses_nothing(finished, capsys, bad, resume):
    run = finished[0]
    before = snapshot(run)
    args = ["--resume", str(run)] if resume else ["--set", f"run.output_dir={run}"]
    code = main(["train", *args, "--set", bad])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flowgrpo")]
    assert code != 0 and len(err) == 1, err
    # the bad key is named, or (a fresh run into this folder) the folder is refused first
    assert bad.split("=")[0].split(".")[1] in err[0] or "already holds a run" in err[0], err
    assert snapshot(run) == before  # no checkpoint, metrics row or config changed


def test_a_resume_on_another_world_size_must_keep_the_global_batch():
    saved = to_dict(load_config(None, ["train.batch_size=8", "train.group_size=4"]))
    same = load_config(None, ["train.batch_size=16", "train.group_size=4"])
    assert resume_lib.check_config(saved, 2, same, 1) == {}  # 2 x 8 == 1 x 16
    with pytest.raises(RunError, match="1 process"):
        resume_lib.check_config(saved, 1, same, 2)
    harmless = load_config(None, ["train.batch_size=8", "train.group_size=4",
                                  "run.epochs=7", "run.save_every=3"])
    assert resume_lib.check_config(saved, 1, harmless, 1) == {
        "run.epochs": [300, 7], "run.save_every": [100, 3]}


def fake_checkpoint(run, step: int, saved_at: float) -> None:
    tmp = ckpt.begin(run, step)
    ckpt.write_json(tmp / "state.json", {"step": step, "saved_at": saved_at})
    (tmp / "trainable.safetensors").write_bytes(b"x" * 64)
    ckpt.commit(tmp, keep=5)


def test_auto_resume_picks_the_run_saved_last_not_the_newest_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_checkpoint(tmp_path / "runs" / "a", 2, saved_at=200.0)
    fake_checkpoint(tmp_path / "runs" / "b", 5, saved_at=100.0)
    os.utime(tmp_path / "runs" / "b", (1e10, 1e10))  # e.g. `flowgrpo report` touched b
    found = ckpt.find_checkpoint("auto", "").resolve()
    assert found == tmp_path / "runs" / "a" / "checkpoints" / "step_2"


def test_a_damaged_checkpoint_is_named_and_auto_falls_back(tmp_path):
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step, saved_at=float(step))
    root = tmp_path / "checkpoints"
    with open(root / "step_3" / "trainable.safetensors", "r+b") as f:
        f.truncate(10)
    (root / "step_2" / "state.json").unlink()
    warnings: list[str] = []
    assert ckpt.find_checkpoint("auto", str(tmp_path), warnings.append) == root / "step_1"
    assert "step_3" in warnings[0] and "trainable.safetensors is damaged (10 bytes" in warnings[0]
    assert "step_2" in warnings[1] and "state.json is missing" in warnings[1]
    with pytest.raises(RunError, match="step_3/trainable.safetensors is damaged"):
        ckpt.find_checkpoint(str(root / "step_3"), "")
    # same size, other bytes: the hash finds it
    (root / "step_1" / "trainable.safetensors").write_bytes(b"y" * 64)
    assert "does not match the hash" in ckpt.verify(root / "step_1")


def test_leftover_temporary_folders_are_removed_at_start(tmp_path):
    ckpt.begin(tmp_path, 7)
    Trainer.from_config(config(tmp_path, "run.epochs=1"))
    assert not list((tmp_path / "checkpoints").glob(".tmp_step_*"))


def test_a_full_disk_is_one_line_and_keeps_earlier_checkpoints(tmp_path, monkeypatch):
    t = Trainer.from_config(config(tmp_path, "run.epochs=2", "run.save_every=1"))
    t.save(1)
    before = ckpt.verify(tmp_path / "checkpoints" / "step_1")
    assert before is None

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(RunError) as err:
        t.save(2)
    assert str(err.value) == (f"checkpoint step_2 was not written: no space left on the device; "
                              f"the earlier checkpoints in {tmp_path / 'checkpoints'} are intact")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_1"]
    assert ckpt.verify(tmp_path / "checkpoints" / "step_1") is None


def test_a_crash_inside_a_checkpoint_write_resumes_from_the_previous_one(tmp_path, monkeypatch):
    t = Trainer.from_config(config(tmp_path, "run.epochs=3"))
    write_manifest = ckpt.write_manifest

    def crash(folder):
        if folder.name == ".tmp_step_2":
            raise KeyboardInterrupt  # a kill just before step 2's manifest is written
        write_manifest(folder)

    with monkeypatch.context() as m:
        m.setattr(ckpt, "write_manifest", crash)
        with pytest.raises(KeyboardInterrupt):
            t.train()
    assert (tmp_path / "checkpoints" / ".tmp_step_2").is_dir()
    resumed = Trainer.from_config(config(tmp_path, "run.epochs=3"), resume="auto")
    assert resumed.start_epoch == 1
    assert not (tmp_path / "checkpoints" / ".tmp_step_2").exists()
