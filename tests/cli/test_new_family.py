"""``flowgrpo new-family``: the adapter and test files it writes for a diffusers pipeline.

On ``StableDiffusion3Pipeline`` (a pipeline the shipped ``sd3`` family covers) the generated
tests run under pytest in a subprocess: they fail while the stubs are unfilled, each failure
saying which method to write and citing the line of the pipeline's source that does it, and
they pass once the stubs are filled by delegating to the shipped SD3 adapter (and the tiny
builder's transformer is written). A fill that gets the timestep units wrong still keeps the
family contract but fails the parity check.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flowgrpo.cli.main import main
from helpers import ROOT
from pipelines import FAMILIES, FlowAdapter

PIPELINE = "StableDiffusion3Pipeline"

TRANSFORMER = '''
    from diffusers import SD3Transformer2DModel

    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=LATENT_CHANNELS, num_layers=2,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=T5_DIM,
        caption_projection_dim=16, pooled_projection_dim=2 * CLIP_DIM,
        out_channels=LATENT_CHANNELS, pos_embed_max_size=16,
    )'''
"""The tiny SD3 transformer over the scaffold's stand-ins: T5 width 32 for the joint attention,
both CLIP poolings (16 + 16) for the pooled projection, the VAE's 4 latent channels."""

SD3 = "from pipelines.sd3 import SD3Adapter\n\n"
METHODS = {  # the shipped SD3 adapter's methods, run on the scaffolded adapter's attributes
    "encode": SD3 + "return SD3Adapter.encode(self, prompts)",
    "noise": '''
        scale = 2 ** (len(self.pipeline.vae.config.block_out_channels) - 1)
        shape = (n, self.transformer.config.in_channels, self.height // scale,
                 self.width // scale)
        return torch.randn(shape, generator=generator, device=self.device)''',
    "schedule": SD3 + "return SD3Adapter.schedule(self, num_steps)",
    "velocity": SD3 + "return SD3Adapter.velocity(self, x, sigma, cond, guidance)",
    "decode": SD3 + "return SD3Adapter.decode(self, x)",
}
# a plausible slip: the transformer given sigma, not the scheduler's 1000 sigma
WRONG_UNITS = {**METHODS, "velocity": SD3 + "return SD3Adapter.velocity(self, x, sigma / 1000, "
               "cond, guidance)"}


def fill(path: Path, bodies: dict[str, str]) -> None:
    """Replace the stubs of ``path`` named in ``bodies``: a method's closing ``raise
    NotImplementedError(...)``, or a tiny-builder line ``name = todo(...)``."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in bodies:
            assert _raises_not_implemented(node), node.name
            edits.append((node.body[-1], bodies[node.name]))
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and getattr(node.value.func, "id", "") == "todo"
              and node.targets[0].id in bodies):
            edits.append((node, bodies[node.targets[0].id]))
    assert len(edits) == len(bodies), (path, [e[1][:20] for e in edits])
    for stmt, body in sorted(edits, key=lambda e: -e[0].lineno):
        text = textwrap.indent(textwrap.dedent(body).strip("\n"), " " * stmt.col_offset)
        lines[stmt.lineno - 1:stmt.end_lineno] = [text + "\n"]
    path.write_text("".join(lines))


def _raises_not_implemented(node: ast.FunctionDef) -> bool:
    last = node.body[-1]
    return (isinstance(last, ast.Raise) and isinstance(last.exc, ast.Call)
            and getattr(last.exc.func, "id", "") == "NotImplementedError")


def scaffold(tmp_path: Path, name: str, pipeline: str = PIPELINE, *extra: str) -> int:
    return main(["new-family", name, "--pipeline", pipeline, "--out", str(tmp_path), *extra])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------------- the CLI
def test_help_lists_the_command_and_its_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["new-family", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("NAME", "--pipeline CLASS", "--out DIR", "--force"):
        assert flag in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "new-family" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "pipeline", "needles"), [
    ("mine", "StableDiffusion3Pipline", ["has no pipeline 'StableDiffusion3Pipline'",
                                        "close matches: StableDiffusion3Pipeline"]),
    ("mine", "stablediffusion3pipeline", ["close matches: StableDiffusion3Pipeline"]),
    ("mine", "AutoencoderKL", ["AutoencoderKL is not a pipeline class"]),
    ("sd3", PIPELINE, ["'sd3' is already a pipeline family (built-in)", "another NAME"]),
    ("My-Model", PIPELINE, ["NAME 'My-Model' must be lowercase"]),
])
def test_bad_arguments_are_one_line_errors_and_write_nothing(tmp_path, capsys, name, pipeline,
                                                             needles):
    assert scaffold(tmp_path / "out", name, pipeline) == 2
    err = one_line_error(capsys)
    assert err.startswith("flowgrpo: new-family: ")
    for needle in needles:
        assert needle in err
    assert not (tmp_path / "out").exists()


def test_a_pipeline_without_its_dependencies_is_named_with_them(tmp_path, capsys):
    import diffusers
    from diffusers.utils import DummyObject

    dummies = [n for n in dir(diffusers) if n.endswith("Pipeline")
               and isinstance(getattr(diffusers, n), DummyObject)]
    if not dummies:
        pytest.skip("every pipeline of diffusers can be imported here")
    assert scaffold(tmp_path, "mine", dummies[0]) == 2
    err = one_line_error(capsys)
    assert f"diffusers' {dummies[0]} needs " in err and "not installed here" in err
    assert "torch" not in err.split("needs ")[1]  # only what is missing


def test_existing_files_are_kept_unless_forced(tmp_path, capsys):
    assert scaffold(tmp_path, "mine") == 0
    out = capsys.readouterr().out
    assert "mine_family.py" in out and "test_mine_family.py" in out
    adapter = tmp_path / "mine_family.py"
    adapter.write_text("# my work\n")
    assert scaffold(tmp_path, "mine") == 2
    err = one_line_error(capsys)
    assert "exists; pass --force" in err
    assert adapter.read_text() == "# my work\n"
    assert scaffold(tmp_path, "mine", PIPELINE, "--force") == 0
    assert "class MineAdapter(FlowAdapter)" in adapter.read_text()
    assert scaffold(adapter, "other") == 2  # --out names a file
    assert "is a file; give a folder" in one_line_error(capsys)


# ----------------------------------------------------------------------- what it writes
def _cited(message: str) -> tuple[str, str]:
    """The lines of the pipeline's source a stub message cites (first, last)."""
    from diffusers import StableDiffusion3Pipeline

    lines = Path(inspect.getsourcefile(StableDiffusion3Pipeline)).read_text().splitlines()
    numbers = [int(n) for n in re.findall(r"pipeline_stable_diffusion_3\.py:(\d+)", message)]
    assert numbers, message
    return lines[numbers[0] - 1], lines[numbers[-1] - 1]


# the code at the line each stub's message cites last (the call in __call__, or the definition)
CITED = {"encode": "self.encode_prompt(", "noise": "def prepare_latents(",
         "schedule": "retrieve_timesteps(", "velocity": "self.transformer(",
         "decode": "self.vae.decode("}


def test_stubs_say_what_to_write_and_cite_the_pipelines_lines(tmp_path):
    """Every abstract method of FlowAdapter is a stub; on a real SD3 pipeline the constructor
    works and each stub raises naming the method and the source line that does its job."""
    from helpers.tiny import tiny_sd3_pipeline

    assert scaffold(tmp_path, "mine") == 0
    source = (tmp_path / "mine_family.py").read_text()
    stubs = {n.name for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.FunctionDef) and _raises_not_implemented(n)}
    assert stubs == set(FlowAdapter.__abstractmethods__)
    with FAMILIES.snapshot():
        cls = FAMILIES.get(f"{tmp_path / 'mine_family.py'}:MineAdapter")
        assert FAMILIES.get("mine") is cls
        adapter = cls(pipeline=tiny_sd3_pipeline(), height=16, width=16)
        assert adapter.transformer is adapter.pipeline.transformer
        assert cls.pipeline_classes == (PIPELINE,)
        calls = {"encode": lambda: adapter.encode(["a"]), "noise": lambda: adapter.noise(1),
                 "schedule": lambda: adapter.schedule(4),
                 "velocity": lambda: adapter.velocity(None, None, None, 1.0),
                 "decode": lambda: adapter.decode(None)}
        for method, call in calls.items():
            with pytest.raises(NotImplementedError) as err:
                call()
            message = str(err.value)
            assert message.startswith(f"mine.{method} is not written: return "), message
            assert CITED[method] in _cited(message)[-1], (method, _cited(message))
    assert "mine" not in FAMILIES


@pytest.mark.parametrize("pipeline", ["FluxPipeline", "WanPipeline", "LongCatAudioDiTPipeline"])
def test_other_pipelines_scaffold_to_importable_files(tmp_path, pipeline):
    """A packed image, a video and an audio pipeline: the files parse, the adapter imports with
    the pipeline's modality and run options, the tiny builder names what it cannot build."""
    assert scaffold(tmp_path, "other", pipeline) == 0
    with FAMILIES.snapshot():
        cls = FAMILIES.get(f"{tmp_path / 'other_family.py'}:OtherAdapter")
    modality = {"WanPipeline": "video", "LongCatAudioDiTPipeline": "audio"}.get(pipeline, "image")
    assert cls.modality == modality
    assert ("num_frames" in inspect.signature(cls.__init__).parameters) == (modality == "video")
    test_source = (tmp_path / "test_other_family.py").read_text()
    ast.parse(test_source)
    assert 'transformer = todo("transformer", ' in test_source


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_generated_files_are_ruff_clean(tmp_path):
    for name, pipeline in (("mine", PIPELINE), ("packed", "FluxPipeline"),
                           ("speech", "LongCatAudioDiTPipeline")):
        assert scaffold(tmp_path, name, pipeline) == 0
    done = subprocess.run(["ruff", "check", "--config", str(ROOT / "pyproject.toml"),
                           str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


# ------------------------------------------------------------- the generated tests, run
def _outcomes(report: Path) -> dict[str, str]:
    """``{test id: "passed" | failure message}`` from a pytest JUnit XML report (what the tests
    printed is echoed)."""
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        printed = case.find("system-out")
        for line in (printed.text or "").splitlines() if printed is not None else []:
            if line.startswith("parity "):
                print(line)
        test_id = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        out[test_id] = "passed" if problem is None else problem.get("message", "")
    return out


@pytest.mark.slow
def test_generated_tests_fail_until_the_stubs_are_filled_then_pass(tmp_path):
    """Three families from the same command in one folder, run by one pytest subprocess:
    ``stub_sd3`` (only its tiny transformer written), ``my_sd3`` (every stub filled from the
    shipped SD3 adapter) and ``slip_sd3`` (filled, with the timestep in the wrong units)."""
    for name in ("fresh_sd3", "stub_sd3", "my_sd3", "slip_sd3"):
        assert scaffold(tmp_path, name) == 0
    for name in ("stub_sd3", "my_sd3", "slip_sd3"):
        fill(tmp_path / f"test_{name}_family.py", {"transformer": TRANSFORMER})
    fill(tmp_path / "my_sd3_family.py", METHODS)
    fill(tmp_path / "slip_sd3_family.py", WRONG_UNITS)
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
         "-o", "junit_logging=system-out",
         "test_fresh_sd3_family.py::test_family_contract", "test_stub_sd3_family.py",
         "test_my_sd3_family.py", "test_slip_sd3_family.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    outcomes = _outcomes(report)
    summary = done.stdout.strip().splitlines()[-1]
    print(summary)
    assert done.returncode == 1, done.stdout[-3000:]

    # nothing filled: the tiny builder says which component to write
    fresh = outcomes.pop("test_fresh_sd3_family::test_family_contract")
    assert "does not build 'transformer' yet" in fresh and "SD3Transformer2DModel" in fresh

    # the methods unfilled: each test fails on the first stub it reaches, naming it
    assert outcomes.pop("test_stub_sd3_family::test_the_file_registers_the_family") == "passed"
    for test in ("test_family_contract", "test_euler_rollout_matches_pipeline[1.0]",
                 "test_euler_rollout_matches_pipeline[4.0]"):
        message = outcomes.pop(f"test_stub_sd3_family::{test}")
        assert re.match(r"NotImplementedError: stub_sd3\.(encode|noise|schedule|velocity|decode) "
                        r"is not written: return .*pipeline_stable_diffusion_3\.py:\d+", message), \
            (test, message)

    # filled: the contract and the parity (with and without CFG) pass
    for test in ("test_the_file_registers_the_family", "test_family_contract",
                 "test_euler_rollout_matches_pipeline[1.0]",
                 "test_euler_rollout_matches_pipeline[4.0]"):
        assert outcomes.pop(f"test_my_sd3_family::{test}") == "passed", test

    # a velocity in the wrong units keeps the contract (ratio 1, LoRA) but not the parity
    assert outcomes.pop("test_slip_sd3_family::test_family_contract") == "passed"
    for guidance in ("1.0", "4.0"):
        message = outcomes.pop(f"test_slip_sd3_family::test_euler_rollout_matches_pipeline"
                               f"[{guidance}]")
        assert f"guidance {guidance}: max abs difference" in message, message
    assert outcomes.pop("test_slip_sd3_family::test_the_file_registers_the_family") == "passed"
    assert not outcomes, outcomes
