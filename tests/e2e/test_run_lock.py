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
from contextlib import contextmanager
from pathlib import Path

import pytest

from flowgrpo.cli.ablate import Cell, run_cell
from flowgrpo.cli.main import main
from flowgrpo.errors import RunError
from flowgrpo.run.lock import LOCK_NAME, acquire, holder


@contextmanager
def held_by_another_process(folder: Path):
    """A live process holding ``folder``'s lock; yields its pid, killed afterwards."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from flowgrpo.run.lock import acquire; "
         "lock = acquire(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"  # the child holds it now
        yield child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_a_held_lock_refuses_another_process_until_released(tmp_path):
    folder = tmp_path / "run"
    with held_by_another_process(folder) as pid:
        with pytest.raises(RunError) as err:
            acquire(folder)
        assert f"is in use by pid {pid} on host {socket.gethostname()}" in str(err.value)
        assert holder(folder)["pid"] == pid
    acquire(folder, lambda message: None).release()  # the child's stale record, taken over
    assert holder(folder) is None and not (folder / LOCK_NAME).exists()


def test_within_one_process_the_lock_is_shared_until_its_last_holder_lets_go(tmp_path):
    first, second = acquire(tmp_path), acquire(tmp_path)  # two trainers of one process
    assert holder(tmp_path)["pid"] == os.getpid()
    first.release()
    assert (tmp_path / LOCK_NAME).exists()
    code = ("import sys; from flowgrpo.run.lock import acquire; acquire(sys.argv[1])")
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                           text=True)
    assert other.returncode != 0 and f"in use by pid {os.getpid()}" in other.stderr
    second.release()
    assert not (tmp_path / LOCK_NAME).exists()
    assert subprocess.run([sys.executable, "-c", code, str(tmp_path)]).returncode == 0


def test_the_lock_of_a_killed_run_is_named_and_taken_over(tmp_path):
    folder = tmp_path / "run"
    with held_by_another_process(folder) as pid:
        pass
    warnings: list[str] = []
    acquire(folder, warnings.append).release()
    assert len(warnings) == 1 and f"stale lock of {folder} (pid {pid}" in warnings[0]
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
    with held_by_another_process(run) as pid:  # the live run
        for extra in (["--overwrite"], []):
            code = main(["train", "--set", f"run.output_dir={run}", *extra])
            err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
            assert code == 1 and len(err) == 1, (extra, err)
            assert err[0].startswith(f"flowgrpo: run folder {run} is in use by pid {pid} "
                                     f"on host {socket.gethostname()} since "), (extra, err)
            assert "wait for that run to end or choose another run.output_dir" in err[0]
            assert _files(run) == before and (run / "checkpoints" / ".tmp_step_2").is_dir()


def test_an_ablation_leaves_a_cell_that_is_still_running_to_its_run(tmp_path):
    cell = Cell("train.lr=0.001", {"train.lr": 0.001}, 0, tmp_path / "train.lr=0.001" / "s0")
    with held_by_another_process(cell.folder) as pid:
        result = run_cell(cell, threads=1)
        assert result is not None and f"is still running (pid {pid}" in result
        assert sorted(p.name for p in cell.folder.iterdir()) == [LOCK_NAME]  # nothing written
        assert not (cell.folder.parent / "s0.log").exists()
