"""Every bad input to ``flowgrpo train`` is ONE line on stderr, before any model weight loads.

Each case runs the CLI in-process and checks: a non-zero exit (2: a config error), exactly one
non-empty stderr line starting with ``flowgrpo:`` that names the key, the file (and line) or the
value, and no traceback anywhere. ``--debug`` / ``FLOWGRPO_DEBUG=1`` let the exception through.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from flowgrpo.cli.main import main
from flowgrpo.config.io import parse_yaml
from flowgrpo.errors import ConfigError
from flowgrpo.training.hub import resolve_path
from helpers import ROOT

REPO = ROOT
DIGITS = f"digits ({resolve_path('digits')})"


class Case(NamedTuple):
    """``files``: name -> text, bytes or ``None`` (an empty folder), written under ``tmp_path``;
    ``args``: after ``train``; ``needles``: substrings of the one stderr line. ``{tmp}`` in
    ``args`` and ``needles`` is ``tmp_path``."""

    id: str
    files: dict[str, str | bytes | None]
    args: list[str]
    needles: list[str]


def _set(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


CASES = [
    # the config file and --set values
    Case("yaml_syntax_error", {"c.yaml": "train:\n  lr: 1.0e-3\n   batch_size: 8\n"},
         ["{tmp}/c.yaml"], ["{tmp}/c.yaml:3: YAML syntax error: mapping values are not allowed"]),
    Case("yaml_unclosed_list", {"c.yaml": "train:\n  lr: 1.0e-3\n  group_size: [4\nrun: {}\n"},
         ["{tmp}/c.yaml"], ["{tmp}/c.yaml:4: YAML syntax error", "flow sequence at line 3"]),
    Case("set_syntax_error", {}, _set("train.lr=[1"),
         ["override 'train.lr=[1': YAML syntax error"]),
    Case("non_utf8", {"c.yaml": b"train:\n  lr: 1.0e-3\n# caf\xe9\n"}, ["{tmp}/c.yaml"],
         ["{tmp}/c.yaml: not UTF-8 text", "0xe9 at line 3"]),
    Case("duplicate_key", {"c.yaml": "train:\n  lr: 1.0e-3\n  batch_size: 16\n  lr: 1.0e-5\n"},
         ["{tmp}/c.yaml"], ["{tmp}/c.yaml:4: duplicate key 'lr' in train (first at line 2)"]),
    Case("config_missing", {}, ["{tmp}/nope.yaml"], ["config file not found: {tmp}/nope.yaml"]),
    # value ranges
    Case("adam_beta1", {}, _set("train.adam_beta1=2"),
         ["train.adam_beta1: invalid value 2.0; must be in [0, 1)"]),
    Case("adam_beta2", {}, _set("train.adam_beta2=1"),
         ["train.adam_beta2: invalid value 1.0; must be in [0, 1)"]),
    Case("weight_decay", {}, _set("train.weight_decay=-5"),
         ["train.weight_decay: invalid value -5.0", ">= 0"]),
    Case("lr_inf", {}, _set("train.lr=.inf"),
         ["train.lr: invalid value inf; must be a finite number"]),
    Case("lr_nan", {}, _set("train.lr=.nan"), ["train.lr: invalid value nan"]),
    Case("other_float_inf", {}, _set("model.guidance=.inf"), ["model.guidance", "inf"]),
    Case("loss_params_key", {}, _set("train.loss_params.bogus=1"),
         ["train.loss_params", "'bogus'", "clip_low"]),
    Case("reward_params_key", {}, _set("reward.params.bogus=1"), ["reward.params", "'bogus'"]),
    Case("reward_weight_inf", {}, _set("reward.components=[{name: digit, weight: .inf}]"),
         ["reward.components[0].weight: invalid value inf; must be a finite number"]),
    # prompt files
    Case("prompts_missing", {}, _set("data.prompts={tmp}/nope.txt"),
         ["data.prompts: prompt set '{tmp}/nope.txt' is neither a built-in"]),
    Case("prompts_empty", {"p.txt": ""}, _set("data.prompts={tmp}/p.txt"),
         ["data.prompts: {tmp}/p.txt has no prompts (empty or blank lines only)"]),
    Case("prompts_blank", {"p.txt": "\n   \n\t\n"}, _set("data.prompts={tmp}/p.txt"),
         ["data.prompts: {tmp}/p.txt has no prompts (empty or blank lines only)"]),
    Case("eval_prompts_blank", {"e.txt": "\n\n"}, _set("data.eval_prompts={tmp}/e.txt"),
         ["data.eval_prompts: {tmp}/e.txt has no prompts"]),
    Case("prompts_not_utf8", {"p.txt": b"a cat\n\xff\n"}, _set("data.prompts={tmp}/p.txt"),
         ["data.prompts: {tmp}/p.txt: not UTF-8 text", "line 2"]),
    Case("jsonl_malformed", {"p.jsonl": '{"prompt": "a"}\n\n{"prompt": "b",\n'},
         _set("data.prompts={tmp}/p.jsonl"),
         ["data.prompts: {tmp}/p.jsonl:3: not valid JSON ("]),
    Case("jsonl_no_prompt", {"p.jsonl": '{"prompt": "a"}\n{"text": "b"}\n'},
         _set("data.prompts={tmp}/p.jsonl"),
         ["data.prompts: {tmp}/p.jsonl:2: every JSON line needs a 'prompt'", "text"]),
    Case("jsonl_not_object", {"p.jsonl": '["a cat"]\n'}, _set("data.eval_prompts={tmp}/p.jsonl"),
         ["data.eval_prompts: {tmp}/p.jsonl:1: expected a JSON object", "list"]),
    # model paths (checked before any weight loads)
    Case("model_path_missing", {}, _set("model.path={tmp}/nope"),
         ["model.path: {tmp}/nope does not exist"]),
    Case("model_path_empty_folder", {"empty": None}, _set("model.path={tmp}/empty"),
         ["model.path: {tmp}/empty is an empty folder"]),
    Case("model_path_no_index", {"m/config.json": "{}"}, _set("model.path={tmp}/m"),
         ["model.path: {tmp}/m has no model_index.json"]),
    Case("model_path_is_file", {"m.safetensors": "x"}, _set("model.path={tmp}/m.safetensors"),
         ["model.path: {tmp}/m.safetensors is a file"]),
    Case("family_flux_on_sd3", {}, _set("model.family=flux"),
         [f"model.path: {DIGITS} holds a StableDiffusion3Pipeline, but model.family is flux "
          "(use model.family: sd3)"]),
    Case("family_wan_on_sd3", {}, _set("model.family=wan"),
         [f"model.path: {DIGITS} holds a StableDiffusion3Pipeline, but model.family is wan "
          "(use model.family: sd3)"]),
]


@pytest.fixture(autouse=True)
def no_weights(monkeypatch):
    """Loading a model is a failure here: every case must be refused before that."""
    import pipelines

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pipelines, "load", refuse)
    monkeypatch.delenv("FLOWGRPO_DEBUG", raising=False)


def write_files(root: Path, files: dict[str, str | bytes | None]) -> None:
    for name, content in files.items():
        path = root / name
        if content is None:
            path.mkdir(parents=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def assert_one_line(code: int, out: str, err: str, needles: list[str]) -> str:
    """Exit 2, one ``flowgrpo:`` line on stderr holding every needle, no traceback; the line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("flowgrpo: config error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in out + err
    assert code == 2, (code, lines[0])
    return lines[0]


def run_train(argv: list[str], tmp_path: Path, capsys) -> tuple[int, str, str]:
    code = main(["train", *argv, "--set", f"run.output_dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line(case, tmp_path, capsys):
    write_files(tmp_path, case.files)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in case.args]
    needles = [needle.replace("{tmp}", str(tmp_path)) for needle in case.needles]
    assert_one_line(*run_train(argv, tmp_path, capsys), needles)


@pytest.fixture
def empty_hub_cache(monkeypatch, tmp_path):
    """A clean Hugging Face home and cache (constants are read at import, so patched too)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_hub_id_offline_fails_fast(empty_hub_cache, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    result = run_train(["--set", "model.path=org/not-cached"], tmp_path, capsys)
    assert_one_line(*result, ["model.path: org/not-cached is not a local folder, not in the "
                              "Hugging Face cache, and the hub is unreachable (HF_HUB_OFFLINE"])
    assert time.monotonic() - start < 5


def test_hub_id_without_network(empty_hub_cache, monkeypatch, tmp_path, capsys):
    from huggingface_hub import constants

    import flowgrpo.training.hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(flowgrpo.training.hub, "hub_reachable", lambda: False)
    result = run_train(["--set", "model.path=org/not-cached"], tmp_path, capsys)
    assert_one_line(*result, ["model.path: org/not-cached is not a local folder", "(no network)"])


def test_cached_hub_id_of_another_family(empty_hub_cache, tmp_path, capsys):
    snapshot = empty_hub_cache / "models--org--a-flux" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    (empty_hub_cache / "models--org--a-flux" / "refs").mkdir()
    (empty_hub_cache / "models--org--a-flux" / "refs" / "main").write_text("abc123")
    result = run_train(["--set", "model.path=org/a-flux"], tmp_path, capsys)
    assert_one_line(*result, ["model.path: org/a-flux holds a FluxPipeline, but model.family is "
                              "sd3 (use model.family: flux)"])


def test_hub_probe_is_bounded_when_dns_hangs(monkeypatch):
    import flowgrpo.training.hub

    release = threading.Event()

    def hang(*args, **kwargs):
        release.wait(10)
        raise OSError("timed out")

    monkeypatch.setattr(flowgrpo.training.hub.socket, "create_connection", hang)
    start = time.monotonic()
    try:
        assert flowgrpo.training.hub.hub_reachable(timeout=0.2) is False
    finally:
        release.set()
    assert time.monotonic() - start < 2


def test_utf8_with_byte_order_mark_loads(tmp_path):
    from flowgrpo.config.io import load_config

    config = tmp_path / "c.yaml"
    config.write_bytes(b"\xef\xbb\xbftrain:\n  lr: 1.0e-4\n")
    assert load_config(config).train.lr == 1e-4


def test_merge_keys_may_override():
    data = parse_yaml("base: &b {lr: 1, beta: 2}\ntrain:\n  <<: *b\n  lr: 3\n", "c.yaml")
    assert data["train"] == {"lr": 3, "beta": 2}


def test_debug_flag_shows_the_exception(tmp_path):
    with pytest.raises(ConfigError, match="train.lr"):
        main(["train", "--debug", "--set", "train.lr=.inf",
              "--set", f"run.output_dir={tmp_path / 'run'}"])


def test_debug_env_shows_the_exception(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWGRPO_DEBUG", "1")
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  lr: 1.0e-3\n  lr: 1.0e-5\n")
    with pytest.raises(ConfigError, match="duplicate key 'lr'"):
        main(["train", str(config), "--set", f"run.output_dir={tmp_path / 'run'}"])


def test_end_to_end_in_a_subprocess(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FLOWGRPO_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "flowgrpo.cli", "train", "--set", "train.lr=.inf",
         "--set", f"run.output_dir={tmp_path / 'run'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert_one_line(proc.returncode, proc.stdout, proc.stderr, ["train.lr: invalid value inf"])
