"""Under ``--quiet`` a command shows its results and warnings only, and everything flowgrpo
prints goes through :mod:`flowgrpo.console`."""

from __future__ import annotations

import pytest

from helpers import ROOT

QUIET_TINY = ["train.batch_size=8", "train.group_size=4", "sampler.num_steps=2",
              "data.eval_images_per_prompt=1", "run.eval_every=1", "run.save_every=1",
              "run.tensorboard=false"]


@pytest.mark.slow
def test_quiet_prints_results_and_warnings_only_through_the_console(tmp_path, capfd):
    """Under --quiet, stdout holds the run's summary alone and stderr the warnings alone, for a
    fresh run and for a resume that has something to warn about."""
    run = tmp_path / "run"
    sets = [a for s in [*QUIET_TINY, f"run.output_dir={run}"] for a in ("--set", s)]
    from flowgrpo.cli.main import main

    assert main(["train", "--quiet", *sets, "--set", "run.epochs=1"]) == 0
    out, err = capfd.readouterr()
    assert out.splitlines()[0] == f"run directory: {run}", out
    assert [line.split(":")[0] for line in out.splitlines()] == [
        "run directory", "time", "eval reward", "last rollout reward/mean", "plot"], out
    assert err.strip() == "", err
    (run / "checkpoints" / ".tmp_step_9").mkdir()  # an unfinished write, which resume removes
    assert main(["train", "--quiet", *sets, "--set", "run.epochs=2", "--resume", "auto"]) == 0
    out, err = capfd.readouterr()
    assert "resuming from" not in out and "run directory " not in out
    assert out.splitlines()[0] == f"run directory: {run}", out
    assert err.splitlines() == [f"flowgrpo: warning: removed {run / 'checkpoints' / '.tmp_step_9'}"
                                ", an unfinished checkpoint write"], err
    # without --quiet the same lines are notes on stdout
    assert main(["train", *sets, "--set", "run.epochs=3", "--set", "run.progress=false",
                 "--resume", "auto"]) == 0
    out, _ = capfd.readouterr()
    assert "flowgrpo: resuming from" in out and "; run directory " in out


def test_flowgrpo_prints_only_through_its_console():
    """No module of the package prints on its own: notes, results and warnings go through
    flowgrpo.console (the command's fault line is the one print to stderr)."""
    import ast

    package = ROOT / "flowgrpo"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print":
                to_stderr = any(k.arg == "file" for k in node.keywords)
                if not (to_stderr and path.name == "main.py"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
