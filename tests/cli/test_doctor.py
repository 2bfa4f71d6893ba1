"""``flowgrpo doctor``: runs offline and reports what a bug report needs."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest
import torch

from flowgrpo.cli import doctor
from flowgrpo.cli.main import main
from reward_models import REWARDS


@pytest.fixture
def plugged():
    def loudness(media, prompts, metadata):
        return media.data.abs().mean(dim=(1, 2))

    with REWARDS.snapshot():
        yield REWARDS.add(loudness)


def test_doctor_runs_offline_and_lists_what_it_should(monkeypatch, plugged, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) <= 25  # short enough to paste
    assert f"python {platform.python_version()}" in out
    for name in ("torch", "diffusers", "transformers", "accelerate", "peft"):
        assert f"{name} {importlib.metadata.version(name)}" in out
    assert f"threads: torch {torch.get_num_threads()}, cores usable" in out
    assert ("device: cuda:0" in out) == torch.cuda.is_available()
    assert "memory: " in out and "GiB" in out
    extras = next(line for line in lines if line.startswith("extras: "))
    for extra, (complete, have) in doctor.extras().items():
        state = "yes" if complete else ("partly" if have else "no")
        assert f"{extra} {state}" in extras
    assert "hub access: off (HF_HUB_OFFLINE is set)" in out
    assert "hub cache: " in out
    assert f"  rewards: {plugged} <- python (test_doctor)" in out


def test_extras_follow_what_is_importable(monkeypatch):
    real = doctor.importlib.util.find_spec

    def without_ocr(name, *args):
        return None if name == "rapidocr_onnxruntime" else real(name, *args)

    monkeypatch.setattr(doctor.importlib.util, "find_spec", without_ocr)
    assert doctor.extras()["ocr"] == (False, [])
    assert "ocr no" in doctor.report(probe=False)


def test_hub_probe_and_model_cache(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("flowgrpo.training.hub.hub_offline", lambda: False)
    monkeypatch.setattr("flowgrpo.training.hub.hub_reachable", lambda: False)
    lines = doctor.hub_lines(probe=True, model="someone/some-model")
    assert lines[1].startswith("hub access: unreachable (")
    assert lines[2] == "model someone/some-model: not cached"
    monkeypatch.setattr("flowgrpo.training.hub.hub_reachable", lambda: True)
    assert doctor.hub_lines(probe=True)[1].startswith("hub access: reachable (")
    assert doctor.hub_lines(probe=False)[1] == "hub access: not checked"
    # a config is read, not validated: one whose model cannot load still reports
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{path: {tmp_path}}}\n")
    assert main(["doctor", str(config), "--no-network"]) == 0
    assert f"model {tmp_path}: local folder" in capsys.readouterr().out
