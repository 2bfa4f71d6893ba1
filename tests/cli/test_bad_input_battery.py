"""Every command on every kind of bad input: a non-zero exit, one line on stderr naming the
culprit, no traceback, and no file of an existing run changed.

The commands run in-process against one finished tiny run of the shipped digits toy (built once
per module); each case may write files under ``tmp_path`` first. ``{run}`` is that run, ``{tmp}``
the case's ``tmp_path``, ``{copy}`` a copy of the run the case may damage (``setup``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from flowgrpo.cli.main import main
from flowgrpo.errors import FlowgrpoError

TINY = ["train.batch_size=8", "train.group_size=4", "sampler.num_steps=2",
        "data.eval_images_per_prompt=1", "run.progress=false", "run.epochs=1",
        "run.eval_every=1", "run.save_every=1", "run.tensorboard=false"]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


REWARDS = """
import math
def boom(media, prompts, metadata):
    raise RuntimeError("the reward exploded")
def short(media, prompts, metadata):
    return [0.5]
def nan(media, prompts, metadata):
    return [math.nan] * len(prompts)
def words(media, prompts, metadata):
    return ["good"] * len(prompts)
"""


def _no_checkpoint(tmp: Path, copy: Path) -> None:
    shutil.rmtree(copy / "checkpoints")


def _damaged(tmp: Path, copy: Path) -> None:
    for path in (copy / "checkpoints").glob("step_*/trainable.safetensors"):
        path.write_bytes(path.read_bytes()[:100])


class Case(NamedTuple):
    """``args``: the whole command line; ``needles``: substrings of the one stderr line;
    ``files``: name -> text or ``None`` (an empty folder), under ``{tmp}``."""

    id: str
    args: list[str]
    needles: list[str]
    files: dict[str, str | None] = {}
    setup: Callable[[Path, Path], None] | None = None


NOT_A_RUN = {"notrun/a.txt": "x"}
FILE = {"f.txt": "x"}
EMPTY = {"empty": None}
CASES = [
    # train
    Case("train_set_no_equals", ["train", "--set", "train.lr"], ["'train.lr' must look like"]),
    Case("train_unknown_section", ["train", "--set", "bogus.x=1"], ["unknown key bogus"]),
    Case("train_unknown_key", ["train", "--set", "train.bogus=1"], ["unknown key train.bogus"]),
    Case("train_wrong_type", ["train", "--set", "train.batch_size=abc"],
         ["train.batch_size: expected int"]),
    Case("train_resume_missing", ["train", "--resume", "{tmp}/nope"], ["{tmp}/nope"]),
    Case("train_resume_empty", ["train", "--resume", "{tmp}/empty"], ["{tmp}/empty"], EMPTY),
    Case("train_resume_not_a_run", ["train", "--resume", "{tmp}/notrun"], ["{tmp}/notrun"],
         NOT_A_RUN),
    Case("train_resume_file", ["train", "--resume", "{tmp}/f.txt"], ["{tmp}/f.txt"], FILE),
    Case("train_resume_no_checkpoint", ["train", "--resume", "{copy}"],
         ["{copy}", "no intact checkpoint"], setup=_no_checkpoint),
    Case("train_resume_damaged", ["train", "--resume", "{copy}"], ["{copy}", "safetensors"],
         setup=_damaged),
    Case("train_into_a_run", ["train", *sets(TINY), "--set", "run.output_dir={run}"],
         ["{run}", "--resume", "--overwrite"]),
    Case("train_output_is_a_file", ["train", *sets(TINY), "--set", "run.output_dir={tmp}/f.txt"],
         ["{tmp}/f.txt"], FILE),
    Case("train_resume_and_overwrite", ["train", "--resume", "{run}", "--overwrite"],
         ["--overwrite", "--resume"]),
    # ablate
    Case("ablate_no_grid", ["ablate"], ["at least one --grid"]),
    Case("ablate_grid_syntax", ["ablate", "--grid", "train.lr"], ["must look like KEY=V1,V2"]),
    Case("ablate_grid_unknown_key", ["ablate", "--grid", "train.bogus=1,2", "--out", "{tmp}/a"],
         ["unknown key train.bogus"]),
    Case("ablate_set_output_dir", ["ablate", "--grid", "train.lr=1e-3,2e-3", "--set",
                                   "run.output_dir={tmp}/x", "--out", "{tmp}/a"],
         ["--set run.output_dir", "use --out"]),
    Case("ablate_grid_seed", ["ablate", "--grid", "run.seed=1,2", "--out", "{tmp}/a"],
         ["--grid run.seed", "use --seeds"]),
    Case("ablate_out_is_a_file", ["ablate", "--grid", "train.lr=1e-3,2e-3", "--out",
                                  "{tmp}/f.txt"], ["{tmp}/f.txt"], FILE),
    Case("ablate_presets_missing", ["ablate", "--grid", "method=a,b", "--presets",
                                    "{tmp}/nope.yaml"], ["{tmp}/nope.yaml"]),
    Case("ablate_list_presets_with_grid", ["ablate", "--list-presets", "--grid", "train.lr=1,2"],
         ["--list-presets", "--grid"]),
    # report
    Case("report_missing", ["report", "{tmp}/nope"], ["{tmp}/nope"]),
    Case("report_empty", ["report", "{tmp}/empty"], ["{tmp}/empty"], EMPTY),
    Case("report_not_a_run", ["report", "{tmp}/notrun"], ["{tmp}/notrun"], NOT_A_RUN),
    Case("report_file", ["report", "{tmp}/f.txt"], ["{tmp}/f.txt"], FILE),
    Case("report_out_is_a_folder", ["report", "{run}", "--out", "{tmp}/empty"],
         ["{tmp}/empty"], EMPTY),
    # sample
    Case("sample_run_missing", ["sample", "--run", "{tmp}/nope"], ["{tmp}/nope"]),
    Case("sample_run_empty", ["sample", "--run", "{tmp}/empty"], ["{tmp}/empty"], EMPTY),
    Case("sample_run_not_a_run", ["sample", "--run", "{tmp}/notrun"], ["{tmp}/notrun"],
         NOT_A_RUN),
    Case("sample_run_file", ["sample", "--run", "{tmp}/f.txt"], ["{tmp}/f.txt"], FILE),
    Case("sample_run_no_checkpoint", ["sample", "--run", "{copy}"], ["{copy}"],
         setup=_no_checkpoint),
    Case("sample_run_damaged", ["sample", "--run", "{copy}", "--out", "{tmp}/s.png"],
         ["{copy}", "safetensors"], setup=_damaged),
    Case("sample_unused_set", ["sample", "--run", "{run}", "--set", "run.seed=3"],
         ["--set run.seed", "use --seed"]),
    Case("sample_num_zero", ["sample", "--num", "0"], ["--num must be >= 1"]),
    Case("sample_out_under_a_file", ["sample", "--run", "{run}", "--num", "1", "--prompt", "a",
                                     "--out", "{tmp}/f.txt/s.png"], ["{tmp}/f.txt"], FILE),
    # eval
    Case("eval_run_missing", ["eval", "--run", "{tmp}/nope"], ["{tmp}/nope"]),
    Case("eval_run_empty", ["eval", "--run", "{tmp}/empty"], ["{tmp}/empty"], EMPTY),
    Case("eval_run_no_checkpoint", ["eval", "--run", "{copy}"], ["{copy}"],
         setup=_no_checkpoint),
    Case("eval_unknown_key", ["eval", "--run", "{run}", "--set", "train.bogus=1"],
         ["unknown key train.bogus"]),
    Case("eval_unused_set", ["eval", "--run", "{run}", "--set", "run.output_dir={tmp}/x"],
         ["--set run.output_dir", "eval writes no files"]),
    # serve-reward
    Case("serve_unknown_reward", ["serve-reward", "--reward", "nope"], ["nope"]),
    Case("serve_bad_params", ["serve-reward", "--reward", "digit", "--params", "{bad"],
         ["--params"]),
    Case("serve_params_not_a_mapping", ["serve-reward", "--reward", "digit", "--params", "[1]"],
         ["--params"]),
    # config, list, doctor
    Case("config_missing", ["config", "{tmp}/nope.yaml"], ["{tmp}/nope.yaml"]),
    Case("config_is_a_folder", ["config", "{tmp}/empty"], ["{tmp}/empty", "is a folder"], EMPTY),
    Case("config_set_syntax", ["config", "--set", "train.lr=[1"], ["YAML syntax error"]),
    Case("config_help_fields_with_set", ["config", "--help-fields", "--set", "train.lr=1"],
         ["--help-fields", "--set"]),
    Case("list_missing_config", ["list", "{tmp}/nope.yaml"], ["{tmp}/nope.yaml"]),
    Case("list_bad_reference", ["list", "--set", "reward.name={tmp}/nope.py:fn"],
         ["reward.name", "{tmp}/nope.py"]),
    Case("doctor_unused_set", ["doctor", "--no-network", "--set", "train.lr=1"],
         ["--set train.lr", "model.path"]),
    Case("doctor_missing_config", ["doctor", "--no-network", "{tmp}/nope.yaml"],
         ["{tmp}/nope.yaml"]),
]

# a reward file whose function misbehaves: caught at the first rollout, before any update
REWARD_CASES = [
    Case("reward_raises", [], ["the reward exploded"]),
    Case("reward_wrong_count", [], ["short returned 1 scores for 10 samples"]),
    Case("reward_nan", [], ["nan", "NaN"]),
    Case("reward_strings", [], ["words", "str"]),
]


def files_of(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("existing") / "run"
    assert main(["train", "--quiet", *sets(TINY), "--set", f"run.output_dir={run}"]) == 0
    from flowgrpo import console

    console.reset()
    return run


def fill(text: str, tmp: Path, run: Path, copy: Path) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{run}", str(run)).replace("{copy}", str(copy))


def assert_refused(argv: list[str], needles: list[str], capsys, run: Path) -> str:
    before = files_of(run)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, (argv, out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("flowgrpo"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in out + err
    assert files_of(run) == before, "a file of the existing run changed"
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_in_one_line(case, existing_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing lands in the repository (runs/, samples.png)
    monkeypatch.delenv("FLOWGRPO_DEBUG", raising=False)
    copy = tmp_path / "copy"
    shutil.copytree(existing_run, copy)
    for name, content in case.files.items():
        path = tmp_path / name
        if content is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    if case.setup:
        case.setup(tmp_path, copy)
    argv = [fill(arg, tmp_path, existing_run, copy) for arg in case.args]
    needles = [fill(n, tmp_path, existing_run, copy) for n in case.needles]
    assert_refused(argv, needles, capsys, existing_run)


@pytest.mark.parametrize("case", REWARD_CASES, ids=[case.id for case in REWARD_CASES])
def test_a_misbehaving_reward_file_stops_the_run_in_one_line(case, existing_run, tmp_path,
                                                            capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text(REWARDS)
    fn = case.id.removeprefix("reward_").replace("raises", "boom").replace(
        "wrong_count", "short").replace("strings", "words")
    argv = ["train", *sets(TINY), "--set", f"reward.name={tmp_path}/rewards.py:{fn}",
            "--set", f"run.output_dir={tmp_path}/new", "--set", "run.on_reward_error=stop"]
    assert_refused(argv, case.needles, capsys, existing_run)


def test_the_python_api_raises_one_line_errors(existing_run, tmp_path, monkeypatch):
    import flowgrpo

    monkeypatch.chdir(tmp_path)
    for call, needle in [
        (lambda: flowgrpo.train(run={"bogus": 1}), "unknown key run.bogus"),
        (lambda: flowgrpo.train(train="fast"), "train: a section override is a dict"),
        (lambda: flowgrpo.train(tmp_path / "nope.yaml"), "config file not found"),
        (lambda: flowgrpo.train(reward_funcs=[]), "reward: an empty list"),
        (lambda: flowgrpo.train(resume=str(tmp_path / "nope")), "nope"),
    ]:
        with pytest.raises(FlowgrpoError) as err:
            call()
        assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def _without_write_permission() -> list[str]:
    """A prefix that runs a command unable to write into a read-only folder, even as root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be shown")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["read_only", "full"])
def test_an_output_folder_that_cannot_be_written_is_one_line(kind, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    cmd = [sys.executable, "-m", "flowgrpo.cli", "train", *sets(TINY), "--set",
           f"run.output_dir={folder / 'run'}"]
    preexec = None
    if kind == "read_only":
        folder.chmod(0o555)
        cmd = _without_write_permission() + cmd
    else:  # a disk that fills up: every file past 64 KiB fails to grow (EFBIG, as ENOSPC)
        import resource
        import signal

        def preexec():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              preexec_fn=preexec, cwd=tmp_path)
    finally:
        folder.chmod(0o755)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1 and lines[0].startswith("flowgrpo"), proc.stderr[-2000:]
    assert str(folder) in lines[0], lines[0]
