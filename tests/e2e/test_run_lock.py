"""One writer per run folder: a second run into a folder a live run holds is refused in one
line naming the owner, and changes nothing there; a lock left by a killed run is named and taken
over; a record from another host is refused with how to remove it; an ablation leaves a cell
that is still running to its run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flowgrpo.cli.ablate import Cell, run_cell
from flowgrpo.cli.main import main
from flowgrpo.errors import RunError
from flowgrpo.run.lock import LOCK_NAME, acquire, holder


def test_a_held_lock_refuses_a_second_owner_until_released(tmp_path):
    lock = acquire(tmp_path / "run")
    with pytest.raises(RunError) as err:
        acquire(tmp_path / "run")
    assert f"is in use by pid {os.getpid()} on host {socket.gethostname()}" in str(err.value)
    assert holder(tmp_path / "run")["pid"] == os.getpid()
    lock.release()
    assert holder(tmp_path / "run") is None and not (tmp_path / "run" / LOCK_NAME).exists()
    acquire(tmp_path / "run").release()


def test_the_lock_of_a_killed_run_is_named_and_taken_over(tmp_path):
    folder = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from flowgrpo.run.lock import acquire; "
         "lock = acquire(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"  # the child holds it now
    with pytest.raises(RunError, match=f"in use by pid {child.pid}"):
        acquire(folder)
    child.send_signal(signal.SIGKILL)
    child.wait()
    warnings: list[str] = []
    acquire(folder, warnings.append).release()
    assert len(warnings) == 1 and f"stale lock of {folder} (pid {child.pid}" in warnings[0]
    assert "no longer running" in warnings[0]


def test_an_unreadable_record_is_taken_over_with_a_warning(tmp_path):
    (tmp_path / LOCK_NAME).write_text("{not json")
    warnings: list[str] = []
    acquire(tmp_path, warnings.append).release()
    assert warnings == [f"took over the stale lock of {tmp_path} (unreadable)"]


def test_a_record_from_another_host_is_refused_with_how_to_remove_it(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 7, "host": "elsewhere"}))
    with pytest.raises(RunError) as err:
        acquire(tmp_path)
    assert "locked by pid 7 on host elsewhere" in str(err.value)
    assert f"delete {tmp_path / LOCK_NAME}" in str(err.value)


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


def test_a_second_train_into_a_held_folder_is_one_line_and_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "checkpoints" / ".tmp_step_2").mkdir()  # what the live run is writing now
    (run / "config.yaml").write_text("model: {}\n")
    before = _files(run)
    lock = acquire(run)  # the live run
    for extra in (["--overwrite"], []):
        code = main(["train", "--set", f"run.output_dir={run}", *extra])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 1 and len(err) == 1, (extra, err)
        assert err[0].startswith(f"flowgrpo: run folder {run} is in use by pid {os.getpid()} "
                                 f"on host {socket.gethostname()} since "), (extra, err)
        assert "wait for that run to end or choose another run.output_dir" in err[0]
        assert _files(run) == before and (run / "checkpoints" / ".tmp_step_2").is_dir()
    lock.release()


def test_an_ablation_leaves_a_cell_that_is_still_running_to_its_run(tmp_path):
    cell = Cell("train.lr=0.001", {"train.lr": 0.001}, 0, tmp_path / "train.lr=0.001" / "s0")
    lock = acquire(cell.folder)
    result = run_cell(cell, threads=1)
    assert result is not None and "is still running (pid" in result
    assert sorted(p.name for p in cell.folder.iterdir()) == [LOCK_NAME]  # nothing written
    assert not (cell.folder.parent / "s0.log").exists()
    lock.release()
