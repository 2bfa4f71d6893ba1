"""Training-step cost per model family, with and without gradient checkpointing, side by side.

For each family (tiny random models from ``tests/helpers/tiny*.py``, inputs scaled up so activations
matter) one training forward+backward is ``adapter.velocity`` on a batch with a LoRA (the
family's ``default_lora_targets``, r=4) on the frozen transformer, then ``loss.backward()``.
Reported, plain and with ``transformer.enable_gradient_checkpointing()``, with their ratios
(checkpointed / plain): the median step time, the activations autograd keeps for backward
("saved": distinct tensors through ``saved_tensors_hooks``; it leaves out the block inputs a
checkpoint holds, one hidden-state tensor per block) and the peak memory of a step.

Time: both modes run in one process on the same model, interleaved repeat by repeat (so load from
other processes hits both alike); the median of ``--repeats`` steps after one warm-up step each.

Peak memory: each (family, mode) runs once more in a fresh subprocess, so one process's peak does
not hide another's. On CUDA it is ``torch.cuda.max_memory_allocated()`` minus the allocation
before the step. On CPU it is the process's peak RSS during the step minus its RSS before
(``resource.getrusage(...).ru_maxrss`` against ``/proc/self/statm``): it counts what the
allocator really took from the OS, so it is coarser (allocator caching, page granularity) than the
CUDA number; tracemalloc is not used because it does not see tensor memory.

    python benchmarks/family_step_time.py [--families sd3 flux wan ace_step] [--batch 2]
        [--repeats 5] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("sd3", "flux", "wan", "ace_step")


def build(family: str) -> Any:
    """The family's tiny adapter at a benchmark size: ~3-4k transformer tokens per sample."""
    for path in (ROOT, ROOT / "tests"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from helpers.tiny import tiny_sd3_pipeline
    from helpers.tiny_families import tiny_ace_step_pipeline, tiny_flux_pipeline, tiny_wan_pipeline
    from pipelines import AceStepAdapter, FluxAdapter, WanAdapter
    from pipelines.sd3 import SD3Adapter

    if family == "sd3":  # 256 px: 128x128 latents, 4096 tokens (wider pos-embed than the tests')
        from diffusers import SD3Transformer2DModel

        pipe = tiny_sd3_pipeline()
        config = {**pipe.transformer.config, "pos_embed_max_size": 64, "sample_size": 128}
        torch.manual_seed(0)
        pipe.transformer = SD3Transformer2DModel.from_config(config)
        return SD3Adapter(pipeline=pipe, height=256, width=256)
    if family == "flux":  # 256 px: 128x128 latents, 4096 packed tokens
        return FluxAdapter(pipeline=tiny_flux_pipeline(), height=256, width=256,
                           max_sequence_length=16)
    if family == "wan":  # 25 frames of 384 px: [16, 7, 48, 48] latents, 4032 tokens
        return WanAdapter(pipeline=tiny_wan_pipeline(), height=384, width=384, num_frames=25,
                          max_sequence_length=16)
    if family == "ace_step":  # 6144 latent frames (4 per second here), 3072 tokens
        return AceStepAdapter(pipeline=tiny_ace_step_pipeline(), audio_duration=1536.0)
    raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")


def prepare(family: str, batch: int, device: str) -> tuple[Any, Any, torch.Tensor]:
    """Adapter with a LoRA (only LoRA weights train), prompt encodings and noisy latents."""
    from peft import LoraConfig

    adapter = build(family).to(device)
    transformer = adapter.transformer
    transformer.requires_grad_(False)
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                       target_modules=list(adapter.default_lora_targets)))
    transformer.train()
    cond = adapter.encode([f"prompt number {i}" for i in range(batch)])
    x = adapter.noise(batch, torch.Generator().manual_seed(0))
    return adapter, cond, x


def train_step(adapter: Any, cond: Any, x: torch.Tensor) -> None:
    """One forward+backward of the transformer (guidance 1: a single branch, no CFG)."""
    sigma = torch.full((x.shape[0],), 0.7, device=x.device)
    loss = adapter.velocity(x, sigma, cond, 1.0).float().pow(2).mean()
    loss.backward()
    adapter.transformer.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def set_checkpointing(transformer: torch.nn.Module, on: bool) -> None:
    if on:
        transformer.enable_gradient_checkpointing()
    else:
        transformer.disable_gradient_checkpointing()


def saved_bytes(adapter: Any, cond: Any, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd saves for backward during one forward."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sigma = torch.full((x.shape[0],), 0.7, device=x.device)
        loss = adapter.velocity(x, sigma, cond, 1.0).float().pow(2).mean()
    loss.backward()
    adapter.transformer.zero_grad(set_to_none=True)
    return total


def time_worker(family: str, batch: int, repeats: int, device: str) -> dict:
    """Median step seconds and saved-activation bytes of both modes, interleaved on one model."""
    adapter, cond, x = prepare(family, batch, device)
    times: dict[bool, list[float]] = {False: [], True: []}
    saved = {}
    for mode in (False, True):  # warm-up each path once
        set_checkpointing(adapter.transformer, mode)
        saved[mode] = saved_bytes(adapter, cond, x)
    for _ in range(repeats):
        for mode in (False, True):
            set_checkpointing(adapter.transformer, mode)
            sync(device)
            start = time.perf_counter()
            train_step(adapter, cond, x)
            sync(device)
            times[mode].append(time.perf_counter() - start)
    tokens = adapter_tokens(adapter, x)
    return {"plain_s": statistics.median(times[False]), "ckpt_s": statistics.median(times[True]),
            "plain_saved": saved[False], "ckpt_saved": saved[True], "tokens": tokens}


def adapter_tokens(adapter: Any, x: torch.Tensor) -> int:
    """Transformer tokens per sample (patches of the latent)."""
    config = adapter.transformer.config
    patch = config.get("patch_size", 1)
    if x.dim() == 3:  # FLUX: already tokens; ACE-Step: frames patched in time
        return x.shape[1] // (patch if adapter.modality == "audio" else 1)
    if x.dim() == 4:
        return (x.shape[2] // patch) * (x.shape[3] // patch)
    p = patch
    return (x.shape[2] // p[0]) * (x.shape[3] // p[1]) * (x.shape[4] // p[2])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_worker(family: str, batch: int, device: str, checkpointing: bool) -> dict:
    """Peak extra bytes of one (first) training step in this fresh process."""
    adapter, cond, x = prepare(family, batch, device)
    set_checkpointing(adapter.transformer, checkpointing)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        train_step(adapter, cond, x)
        torch.cuda.synchronize()
        return {"peak_bytes": torch.cuda.max_memory_allocated() - before}
    before = rss_bytes()
    train_step(adapter, cond, x)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return {"peak_bytes": max(0, peak - before)}


def run_worker(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True,
                         text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--batch", type=int, default=2, help="samples per step")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per mode")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # [kind, family, ...]: one measurement in this process
        kind, family = args.worker[:2]
        torch.manual_seed(0)
        if kind == "time":
            result = time_worker(family, args.batch, args.repeats, args.device)
        else:
            result = memory_worker(family, args.batch, args.device, kind == "mem-ckpt")
        print(json.dumps(result))
        return

    unit = "max_memory_allocated" if args.device == "cuda" else "peak RSS delta"
    print(f"device={args.device} batch={args.batch} repeats={args.repeats} "
          f"threads={torch.get_num_threads()} peak={unit}; x = checkpointed / plain")
    header = (f"{'family':<9} {'tokens':>6} {'step ms':>8} {'ckpt ms':>8} {'time x':>6} "
              f"{'saved MB':>8} {'ckpt':>6} {'x':>5} {'peak MB':>8} {'ckpt':>6} {'x':>5}")
    print(header)
    print("-" * len(header))
    common = ["--batch", str(args.batch), "--repeats", str(args.repeats), "--device", args.device]
    mb = 2**20
    for family in args.families:
        t = run_worker("time", family, *common)
        plain = run_worker("mem-plain", family, *common)["peak_bytes"] / mb
        ckpt = run_worker("mem-ckpt", family, *common)["peak_bytes"] / mb
        peak_x = f"{ckpt / plain:5.2f}" if plain > 0 else f"{'n/a':>5}"
        print(f"{family:<9} {t['tokens']:>6} {t['plain_s'] * 1e3:8.0f} {t['ckpt_s'] * 1e3:8.0f} "
              f"{t['ckpt_s'] / t['plain_s']:6.2f} {t['plain_saved'] / mb:8.1f} "
              f"{t['ckpt_saved'] / mb:6.1f} {t['ckpt_saved'] / t['plain_saved']:5.2f} "
              f"{plain:8.1f} {ckpt:6.1f} {peak_x}")

if __name__ == "__main__":
    main()
