"""``benchmarks/gpu.py``: its tiny run reports every figure for every family and lever, and its
FLOP counter (``benchmarks/_flops.py``) agrees with ``torch.utils.flop_counter`` on the tiny
models of the same classes, forward and forward + backward with a LoRA."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu  # noqa: E402
from _flops import call_flops  # noqa: E402

FIGURES = ("seconds_per_iteration", "samples_per_second", "peak_memory_bytes", "floor_seconds",
           "iteration_over_floor", "mfu_train", "mfu_train_3x", "mfu_nograd",
           "model_tflops_per_iteration", "train_seconds", "nograd_seconds")
LEVER_FIGURES = ("seconds_per_iteration", "samples_per_second", "peak_memory_bytes", "time_x",
                 "memory_x", "mfu_train", "mfu_nograd")
ENCODER_FIGURES = ("parameters", "weight_bytes", "forward_seconds", "offload_round_trip_seconds")


def finite_positive(row: dict, keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        assert key in row, f"{where}: no {key}"
        value = row[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, \
            f"{where}: {key} = {value!r}"


@pytest.mark.slow
def test_tiny_run_reports_every_field_finite(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--tiny", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "gpu_bench.json").read_text())
    table = (out / "gpu_bench.md").read_text()
    finite_positive(result, ("peak_tflops", "seconds_total"), "run")
    assert set(result["families"]) == set(gpu.FAMILIES)
    for family, row in result["families"].items():
        assert row["fallback"] == "recipe", row.get("out_of_memory")
        finite_positive(row, FIGURES, family)
        finite_positive(row["flops_per_row"], ("forward", "backward"), family)
        finite_positive(row["text_encoder"], ENCODER_FIGURES, f"{family} text encoder")
        # the calls are the scaled recipe's: 3 steps, the last untrained (wan: a window of 2),
        # a chunk of 4, CFG doubling sd3's and wan's rows, the KL's reference calls (beta > 0)
        cfg = 2 if family in gpu.TRUE_CFG else 1
        assert row["rows_grad"] == 2 * 4 * cfg
        assert row["rows_nograd"] == (3 + 2) * 4 * cfg
        assert row["transformer_calls"] == 3 + 2 + 2
        assert row["mfu_train_3x"] > row["mfu_train"]  # a LoRA backward is under 2x forward
        assert list(row["levers"]) == gpu.DEFAULT_LEVERS[family]
        for lever, entry in row["levers"].items():
            assert "error" not in entry, (family, lever, entry)
            if "skipped" in entry:
                assert lever in ("two_processes", "compile"), (family, lever, entry)
            else:
                finite_positive(entry, LEVER_FIGURES, f"{family} {lever}")
        assert f"| {family} |" in table
    sd3 = result["families"]["sd3"]["levers"]
    assert sd3["cfg_free"]["rows_grad"] == 2 * 4  # trained unguided: half the rows
    assert sd3["steps_per_call"]["against"] == "gradient_checkpointing"
    # both trained steps in one training call, and their reference calls in one too
    assert sd3["steps_per_call"]["transformer_calls"] == 3 + 1 + 1
    assert sd3["steps_per_call"]["rows_grad"] == result["families"]["sd3"]["rows_grad"]


def lora_model(family: str):
    """The tiny transformer of ``family`` with a rank-4 LoRA on the family's default targets,
    and inputs of odd sizes (3 rows, 7 text tokens)."""
    import diffusers
    from peft import LoraConfig

    cls = {"sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel",
           "wan": "WanTransformer3DModel"}[family]
    torch.manual_seed(0)
    model = getattr(diffusers, cls).from_config(dict(gpu.TINY[family]["transformer"]))
    model.requires_grad_(False)
    targets = tuple(gpu.bench_adapter(family).default_lora_targets)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                 target_modules=list(targets)))
    c, b, text = model.config, 3, 7
    context = torch.randn(b, text, c.get("joint_attention_dim") or c["text_dim"])
    if family == "sd3":
        x = torch.randn(b, c.in_channels, 12, 10)
        kwargs = {"pooled_projections": torch.randn(b, c.pooled_projection_dim),
                  "timestep": torch.rand(b) * 1000}
    elif family == "flux":
        x = torch.randn(b, 30, c.in_channels)
        kwargs = {"pooled_projections": torch.randn(b, c.pooled_projection_dim),
                  "timestep": torch.rand(b), "guidance": torch.full((b,), 3.5),
                  "txt_ids": torch.zeros(text, 3), "img_ids": torch.zeros(30, 3)}
    else:
        x = torch.randn(b, c.in_channels, 3, 8, 6)
        kwargs = {"timestep": torch.rand(b) * 1000}
    return model, targets, x, {"encoder_hidden_states": context, **kwargs}, text


@pytest.mark.parametrize("family", gpu.FAMILIES)
def test_flop_counter_matches_flop_counter_mode(family):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model, targets, x, kwargs, text = lora_model(family)
    # the math attention is plain matrix products, which FlopCounterMode counts on the CPU
    with sdpa_kernel(SDPBackend.MATH):
        with torch.no_grad(), FlopCounterMode(display=False) as counted:
            model(hidden_states=x, return_dict=False, **kwargs)
        forward = counted.get_total_flops()
        with FlopCounterMode(display=False) as counted:
            model(hidden_states=x, return_dict=False, **kwargs)[0].float().square().mean() \
                .backward()
        both = counted.get_total_flops()
    ours = call_flops(family, dict(model.config), tuple(x.shape), text, 4, targets)
    plain = call_flops(family, dict(model.config), tuple(x.shape), text)
    assert ours.forward == pytest.approx(forward, rel=0.02)
    assert ours.forward + ours.backward == pytest.approx(both, rel=0.02)
    assert plain.forward < ours.forward  # the LoRA's own products are counted
    assert ours.backward < 2 * ours.forward  # frozen weights: no weight gradients
