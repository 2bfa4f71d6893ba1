"""The ``flowgrpo`` command's console: a LoRA loads into the transformer alone (no warning about
the text encoders it never trained), known-harmless library messages are filtered at their own
logger while every other library warning still prints, ``--quiet`` silences flowgrpo's bars and
notes, ``--verbose`` shows everything, and nothing changes for a Python API user."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch

from flowgrpo import console
from helpers import ROOT
from helpers.tiny_runs import write_tiny_config

LIBRARY_LOGGERS = ("diffusers", "transformers")
LORA_KEYS_WARNING = "No LoRA keys associated to"


def _hub_bars_disabled() -> bool:
    from huggingface_hub.utils import are_progress_bars_disabled

    return are_progress_bars_disabled()


def _library_state() -> dict:
    """Everything :func:`console.configure` may change, as plain values."""
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    watched = {h.logger for h in console.HARMLESS}
    return {
        "levels": {n: logging.getLogger(n).level for n in LIBRARY_LOGGERS},
        "bars": (dlog.is_progress_bar_enabled(), tlog.is_progress_bar_enabled(),
                 _hub_bars_disabled()),
        "filters": {n: list(logging.getLogger(n).filters) for n in watched},
        "meta_path": list(sys.meta_path),
        "level": console.level(),
    }


@pytest.fixture(autouse=True)
def restore_logging():
    """Each test starts from, and leaves, the process's logging as it found it."""
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    before = _library_state()
    yield
    console.reset()
    for name, lvl in before["levels"].items():
        logging.getLogger(name).setLevel(lvl)
    for module, shown in zip((dlog, tlog), before["bars"][:2]):
        (module.enable_progress_bar if shown else module.disable_progress_bar)()
    if _hub_bars_disabled() != before["bars"][2]:
        (disable_progress_bars if before["bars"][2] else enable_progress_bars)()
    for name, filters in before["filters"].items():
        logging.getLogger(name).filters[:] = filters
    after = _library_state()
    assert after == before, "console.reset() left the library logging changed"


@contextmanager
def library_log(caplog):
    """Capture the diffusers and transformers loggers in ``caplog`` (neither propagates to the
    root logger, where ``caplog`` listens by default)."""
    loggers = [logging.getLogger(n) for n in LIBRARY_LOGGERS]
    for lg in loggers:
        lg.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        for lg in loggers:
            lg.removeHandler(caplog.handler)


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def tiny_sd3():
    import pipelines
    from helpers.tiny import tiny_sd3_pipeline

    return pipelines.load("sd3", None, pipeline=tiny_sd3_pipeline())


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """A LoRA of the tiny SD3 transformer written with ``save_lora``; alpha 8 at rank 4, so that
    a loader that drops the stored alpha gives other velocities."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    folder = tmp_path_factory.mktemp("lora")
    adapter = tiny_sd3()
    adapter.add_lora(LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in adapter.transformer.named_parameters():
            if "lora_B" in name:  # gaussian init leaves B at zero
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    config = adapter.transformer.peft_config["default"].to_dict()
    adapter.save_lora(str(folder), get_peft_model_state_dict(adapter.transformer), config)
    return str(folder)


def velocity(adapter) -> torch.Tensor:
    x = adapter.noise(2, torch.Generator().manual_seed(1))
    with torch.no_grad():
        return adapter.velocity(x, torch.full((2,), 0.7), adapter.encode(["a 1", "a 2"]), 1.0)


# ---- the LoRA loads into the component it trained ------------------------------------------


def test_load_lora_matches_load_lora_weights_without_text_encoder_warnings(lora_dir, caplog):
    console.configure(console.VERBOSE)  # nothing filtered: a quiet load is the loader's doing
    base = velocity(tiny_sd3())
    with library_log(caplog):
        ours = tiny_sd3()
        ours.load_lora(lora_dir)
        assert not [m for m in messages(caplog) if LORA_KEYS_WARNING in m]
        theirs = tiny_sd3()
        theirs.pipeline.load_lora_weights(lora_dir)  # what a diffusers user runs
        assert len([m for m in messages(caplog) if LORA_KEYS_WARNING in m]) == 2
    assert (velocity(ours) - base).abs().max() > 1e-3
    assert torch.equal(velocity(ours), velocity(theirs))
    mine, users = ours.transformer.peft_config, theirs.transformer.peft_config
    assert list(mine) == list(users) == ["default_0"]
    assert mine["default_0"].to_dict() == users["default_0"].to_dict()
    assert (mine["default_0"].r, mine["default_0"].lora_alpha) == (4, 8)
    assert ours.pipeline.get_list_adapters() == {"transformer": ["default_0"]}


def test_transformer_without_load_lora_adapter_goes_through_the_pipeline():
    from pipelines import FlowAdapter

    calls = []

    class Pipeline:
        def load_lora_weights(self, directory):
            calls.append(directory)

    class Plain(FlowAdapter):
        encode = noise = schedule = velocity = decode = None

        def __init__(self):
            self.transformer, self.pipeline = torch.nn.Linear(2, 2), Pipeline()

    Plain().load_lora("some/folder")
    assert calls == ["some/folder"]


# ---- filters: narrow, undone by VERBOSE, never doubled -----------------------------------------


def test_normal_drops_only_the_known_harmless_messages(lora_dir, caplog):
    from diffusers.utils.logging import get_logger
    from transformers.utils.logging import get_logger as transformers_logger

    from helpers.tiny import tiny_sd3_pipeline

    console.configure(console.NORMAL)
    with library_log(caplog):
        get_logger("diffusers.loaders.foo").warning("something real")
        transformers_logger("transformers.foo").warning("something real too")
        # the same logger as the filtered message, but a LoRA without transformer weights: real
        get_logger("diffusers.loaders.lora_base").warning(
            f"{LORA_KEYS_WARNING} SD3Transformer2DModel found with the prefix='transformer'.")
        tiny_sd3_pipeline().load_lora_weights(lora_dir)  # both text encoders: harmless
        shown = messages(caplog)
    assert "something real" in shown and "something real too" in shown
    lora = [m for m in shown if LORA_KEYS_WARNING in m]
    assert len(lora) == 1 and "SD3Transformer2DModel" in lora[0]

    caplog.clear()
    console.configure(console.VERBOSE)
    with library_log(caplog):
        tiny_sd3_pipeline().load_lora_weights(lora_dir)
        lora = [m for m in messages(caplog) if LORA_KEYS_WARNING in m]
    assert len(lora) == 2 and all("prefix='text_encoder" in m for m in lora)


def test_configure_is_idempotent_and_switches_levels():
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    def our_filters():
        return sum(isinstance(f, console._Drop) for h in console.HARMLESS
                   for f in logging.getLogger(h.logger).filters)

    levels = {n: logging.getLogger(n).getEffectiveLevel() for n in LIBRARY_LOGGERS}
    hub = _hub_bars_disabled()
    console.configure(console.NORMAL)
    console.configure(console.NORMAL)
    assert our_filters() == len(console.HARMLESS) >= 1
    assert {n: logging.getLogger(n).getEffectiveLevel() for n in LIBRARY_LOGGERS} == levels
    assert not dlog.is_progress_bar_enabled() and not tlog.is_progress_bar_enabled()
    assert _hub_bars_disabled() == hub  # downloads keep their bars

    console.configure(console.QUIET)
    assert our_filters() == len(console.HARMLESS)
    assert all(logging.getLogger(n).level == logging.ERROR for n in LIBRARY_LOGGERS)
    assert _hub_bars_disabled()

    console.configure(console.VERBOSE)
    assert our_filters() == 0
    assert all(logging.getLogger(n).level == logging.INFO for n in LIBRARY_LOGGERS)
    assert dlog.is_progress_bar_enabled() and tlog.is_progress_bar_enabled()

    console.configure(console.NORMAL)
    assert our_filters() == len(console.HARMLESS)
    assert {n: logging.getLogger(n).getEffectiveLevel() for n in LIBRARY_LOGGERS} == levels
    assert _hub_bars_disabled() == hub
    with pytest.raises(ValueError, match="QUIET, NORMAL or VERBOSE"):
        console.configure(3)


# ---- flowgrpo's own bars and notes -------------------------------------------------------------


def test_quiet_hides_flowgrpo_progress_and_notes(capsys):
    console.configure(console.QUIET)
    assert console.show_progress(True) is False
    console.note("wrote 4 samples to x.png")
    assert capsys.readouterr().out == ""

    console.configure(console.NORMAL)
    assert console.show_progress(True) is True and console.show_progress(False) is False
    console.note("wrote 4 samples to x.png")
    assert capsys.readouterr().out == "wrote 4 samples to x.png\n"


# ---- the command, end to end -------------------------------------------------------------------


@pytest.fixture
def tiny_run(tiny_sd3_dir, tmp_path, brightness_reward):
    """A tiny trained run (2 epochs, LoRA rank 4) and its config file."""
    from flowgrpo.cli.main import main

    path = write_tiny_config(tmp_path, tiny_sd3_dir, brightness_reward, eval_every=0,
                             save_every=2, tensorboard=False)
    assert main(["train", str(path)]) == 0
    return tmp_path / "run", path


@pytest.mark.slow
def test_sample_prints_no_lora_warning_and_loads_the_lora(tiny_run, tmp_path, caplog, capfd):
    from flowgrpo.cli.inference import load_trained, run_config
    from flowgrpo.cli.main import main

    run, config = tiny_run
    capfd.readouterr()
    png = tmp_path / "tuned.png"
    with library_log(caplog):
        assert main(["sample", "--run", str(run), "--prompt", "a handwritten digit 1",
                     "--num", "2", "--out", str(png)]) == 0
    out, err = capfd.readouterr()
    assert f"wrote 2 samples to {png}" in out
    assert not [m for m in messages(caplog) if LORA_KEYS_WARNING in m]
    for text in (LORA_KEYS_WARNING, "Loading pipeline components", "Loading weights"):
        assert text not in err and text not in out, text

    cfg = run_config(str(run))
    tuned, base = load_trained(cfg, str(run)), load_trained(cfg, None)
    assert any("lora_" in n for n, _ in tuned.transformer.named_parameters())
    assert (velocity(tuned) - velocity(base)).abs().max() > 1e-4

    assert main(["sample", "--run", str(run), "--quiet", "--num", "1",
                 "--out", str(tmp_path / "q.png")]) == 0
    assert capfd.readouterr().out == ""


# ---- a Python API user: nothing changes until configure ----------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DIFFUSERS_VERBOSITY", "TRANSFORMERS_VERBOSITY",
                        "HF_HUB_DISABLE_PROGRESS_BARS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


STATE = """
import logging, sys
import diffusers.utils.logging as d, transformers.utils.logging as t
from huggingface_hub.utils import are_progress_bars_disabled as hub
def state():
    names = ("diffusers", "transformers", "diffusers.loaders.lora_base")
    return ([(logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names],
            d.is_progress_bar_enabled(), t.is_progress_bar_enabled(), hub(), list(sys.meta_path))
"""


@pytest.mark.slow
def test_importing_flowgrpo_leaves_library_logging_alone():
    _python(STATE + """
before = state()
import flowgrpo, flowgrpo.cli, flowgrpo.console, flowgrpo.cli.inference
import flowgrpo.training.trainer, pipelines
from pipelines.sd3 import SD3Adapter
assert state() == before, (state(), before)
""")


@pytest.mark.slow
def test_configure_before_the_libraries_are_imported():
    """The command configures before diffusers is imported: the settings apply when a model is
    about to load, an unrelated library warning still reaches stderr, and ``reset`` undoes it
    all."""
    done = _python("""
import sys
from flowgrpo import console
console.configure(console.NORMAL)
assert "diffusers" not in sys.modules and "transformers" not in sys.modules
""" + STATE + """
console.apply_to_libraries()  # what load_adapter does before a model loads
levels, dbar, tbar, hub_off, _ = state()
assert not dbar and not tbar and not hub_off, (dbar, tbar, hub_off)
assert levels[0][0] == levels[1][0] == logging.WARNING, levels
assert any(isinstance(f, console._Drop) for f in levels[2][1])
d.get_logger("diffusers.loaders.foo").warning("something real")
console.configure(console.QUIET)
assert logging.getLogger("diffusers").level == logging.ERROR and hub()
console.reset()
levels, dbar, tbar, hub_off, _ = state()
assert [lvl for lvl, _ in levels[:2]] == [logging.WARNING] * 2 and not levels[2][1], levels
assert dbar and tbar and not hub_off, (dbar, tbar, hub_off)
""")
    assert "something real" in done.stderr

