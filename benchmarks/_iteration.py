"""Shared pieces of the iteration benchmarks (not a benchmark itself).

Used by ``overhead.py``, ``step_selection.py``, ``objectives.py`` and ``lora_toggle.py``.

Every benchmark here runs real GRPO iterations of
:class:`flowgrpo.training.trainer.Trainer` (the four phases of ``Trainer.epoch``: ``sample``,
``views.extend``, ``advantages``, ``update``, then ``calls.take``) on two models:

- ``toy``: the shipped default job (``configs/digits.yaml``: the digits model, ``sde`` sampler,
  groups of 8, batch 64, LoRA r=16, ``beta`` 0.01, no CFG);
- ``sd3``: the random tiny SD3 pipeline of ``tests/helpers/tiny.py`` saved to a temporary folder,
  with ``model.options={}``, the ``jpeg_compressibility`` reward and CFG (``model.guidance=4.5``,
  the SD3.5 recipes' value); everything else as the toy job.

Peak memory is read from ``/proc/self/status`` (``VmHWM``, the peak resident set) after resetting
it through ``/proc/self/clear_refs`` once the trainer is built, so the number is the extra
resident memory the iterations needed over the built trainer's. Where that reset is not
allowed it falls back to ``resource.getrusage(...).ru_maxrss`` (then the peak of model loading
may hide the iterations' peak). tracemalloc is not used: it does not see tensor memory.

glibc's allocator keeps freed large blocks for reuse once it has raised its mmap threshold
(dynamically, after the first large frees), so that resident peak also counts its cache: it
grows with the number of large allocate/free cycles, not only with the live tensors. The
comparisons therefore measure each configuration twice, the second time with
``MALLOC_MMAP_THRESHOLD_=65536`` (a fixed threshold: every freed block of 64 KiB or more goes
back to the OS at once), whose peak follows the live tensors.
"""

from __future__ import annotations

import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stdout
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("toy", "sd3")
TIGHT = "MALLOC_MMAP_THRESHOLD_=65536"
RUN = ["run.tensorboard=false", "run.progress=false", "run.eval_every=0", "run.save_every=0"]


def set_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` unless 0 (keep torch's default).

    The benchmarks default to 1 thread: on a machine whose cores other processes also use, a
    parallel region waits for its slowest thread, and a thread that is not running stalls it.
    Measured on the 2-core machine of ``docs/performance.md`` with a test suite and two niced
    training runs beside it (load average 5): the toy iteration took 3.0 s (median; 0.8 s when
    the machine was quiet) with 2 threads, and the iteration / floor pairs scattered from 0.06
    to 22; with 1 thread it took 0.9 s and the pairs stayed within 1.08-1.13."""
    if threads:
        torch.set_num_threads(threads)


def machine_info() -> str:
    """One line: CPUs, torch version and intra-op threads, Python."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return (f"machine: {platform.machine()}, os.cpu_count()={os.cpu_count()} (usable {usable}), "
            f"torch {torch.__version__}, torch.get_num_threads()={torch.get_num_threads()}, "
            f"python {platform.python_version()}, cuda={torch.cuda.is_available()}")


@contextmanager
def sd3_folder() -> Iterator[str]:
    """The tiny SD3 pipeline of ``tests/helpers/tiny.py``, saved with ``save_pretrained``; its
    folder."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tiny import tiny_sd3_pipeline

    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-sd3-") as tmp:
        tiny_sd3_pipeline().save_pretrained(tmp)
        yield tmp


def model_overrides(model: str, sd3_path: str | None) -> list[str]:
    """Config overrides selecting ``model`` (``toy`` or ``sd3``; ``sd3`` needs its folder)."""
    if model == "toy":
        return []
    if model == "sd3":
        if sd3_path is None:
            raise ValueError("the sd3 model needs the folder made by sd3_folder()")
        return [f"model.path={sd3_path}", "model.options={}", "reward.name=jpeg_compressibility",
                "model.guidance=4.5"]
    raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")


def build_trainer(overrides: list[str], output_dir: str, config: str | None = None) -> Any:
    """A :class:`~flowgrpo.training.trainer.Trainer` of ``config`` (a YAML file; None: the
    default config) with ``overrides``, writing only into ``output_dir`` (no TensorBoard, no
    progress bar, no eval, no checkpoints)."""
    from flowgrpo.config.io import load_config
    from flowgrpo.training.trainer import Trainer

    cfg = load_config(config, [*RUN, f"run.output_dir={output_dir}", *overrides])
    with redirect_stdout(io.StringIO()):  # the trainer's one-line banner
        return Trainer.from_config(cfg)


def iteration(trainer: Any, epoch: int) -> dict[str, float]:
    """One GRPO iteration, exactly the work of ``Trainer.epoch`` but logging: roll out, views,
    advantages, update; returns the epoch's ``calls/*`` counts."""
    batch = trainer.sample(epoch)
    trainer.views.extend(trainer.session, trainer.rewards.score, batch, epoch)
    adv, _ = trainer.advantages(batch)
    trainer.update(batch, adv, epoch)
    return trainer.calls.take()


class OtherLoad:
    """How much CPU other processes took while a benchmark ran: the machine's busy CPU time
    (``/proc/stat``) minus this process's and its children's, over the CPUs' wall time."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / tick  # all but idle and iowait
        usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN)]
        mine = sum(u.ru_utime + u.ru_stime for u in usage)
        return busy, fields[1] / tick, mine, time.monotonic()

    def line(self) -> str:
        busy, nice, mine, now = self._read()
        cpus = os.cpu_count() or 1
        wall = max((now - self.start[3]) * cpus, 1e-9)
        other = max(busy - self.start[0] - (mine - self.start[2]), 0.0)
        return (f"other processes used {100 * other / wall:.0f}% of the {cpus} CPUs during the "
                f"run ({100 * (nice - self.start[1]) / wall:.0f}% at a lower priority, 'nice'; "
                f"{now - self.start[3]:.0f} s; /proc/stat)")


def rss_bytes() -> int:
    """The process's resident set now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> bool:
    """Reset the process's peak resident set (``VmHWM``); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes(was_reset: bool) -> int:
    """The peak resident set since :func:`reset_peak` (or since start when it was refused)."""
    if was_reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def run_worker(script: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``script --worker ARGS`` in a fresh Python process (``env`` added to the
    environment); its last stdout line as JSON."""
    out = subprocess.run([sys.executable, script, "--worker", *args], capture_output=True,
                         text=True, check=False, cwd=ROOT,
                         env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def quiet() -> None:
    """Silence the loading bars and warnings of diffusers / transformers in a worker."""
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from diffusers.utils import logging as dlog

        dlog.set_verbosity_error()
        dlog.disable_progress_bar()
    except ImportError:
        pass
    try:
        from transformers.utils import logging as tlog

        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
    except ImportError:
        pass


# ----------------------------------------------------------------- comparing configurations
def steps_per_sample(trainer: Any, epoch: int) -> int:
    """``J``, the trained steps per sample the trainer's step selection gives at ``epoch``."""
    cfg = trainer.cfg.train
    groups = torch.arange(cfg.batch_size) // cfg.group_size
    sigmas = trainer.adapter.schedule(trainer.cfg.sampler.num_steps)
    steps = trainer.selection.select(sigmas, groups, epoch, trainer.sampler)
    return int(steps.shape[1]) if trainer.objective.needs_transitions else 0


def time_worker(model: str, sd3_path: str | None, configs: dict[str, list[str]], warmup: int,
                iterations: int) -> dict:
    """Every configuration's trainer in this process, their iterations interleaved round-robin
    (so load from other processes hits all alike): per configuration the seconds and
    ``calls/*`` of each timed iteration and the trained steps per sample."""
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-") as tmp:
        trainers = {name: build_trainer([*model_overrides(model, sd3_path), *overrides],
                                        str(Path(tmp) / str(i)))
                    for i, (name, overrides) in enumerate(configs.items())}
        for epoch in range(warmup):
            for trainer in trainers.values():
                iteration(trainer, epoch)
        for name, trainer in trainers.items():
            out[name] = {"seconds": [], "nograd": [], "grad": [],
                         "steps": steps_per_sample(trainer, warmup)}
        for epoch in range(warmup, warmup + iterations):
            for name, trainer in trainers.items():
                start = time.perf_counter()
                calls = iteration(trainer, epoch)
                out[name]["seconds"].append(time.perf_counter() - start)
                out[name]["nograd"].append(calls["calls/nograd"])
                out[name]["grad"].append(calls["calls/grad"])
    return out


def memory_worker(model: str, sd3_path: str | None, overrides: list[str], iterations: int) -> dict:
    """Peak extra resident memory of ``iterations`` iterations over the built trainer's, in
    this (fresh) process."""
    import gc

    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-") as tmp:
        trainer = build_trainer([*model_overrides(model, sd3_path), *overrides], tmp)
        gc.collect()
        was_reset = reset_peak()
        before = rss_bytes()
        for epoch in range(iterations):
            iteration(trainer, epoch)
        return {"peak_bytes": max(peak_bytes(was_reset) - before, 0), "reset": was_reset}


def compare_main(description: str, script: str, configs: dict[str, list[str]],
                 baseline: str) -> None:
    """The command line of a benchmark comparing ``configs`` (name: config overrides) on the toy
    and the tiny SD3: time and calls from one interleaved process per model, peak memory from
    one fresh process per (model, configuration); ratios against ``baseline``."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", choices=("toy", "sd3", "both"), default="both")
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations per config")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--memory-iterations", type=int, default=1,
                        help="iterations of each fresh memory process")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default; see set_threads)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    set_threads(args.threads)
    if args.worker:  # kind, model, sd3 folder or "-", [config]
        quiet()
        kind, model, path = args.worker[:3]
        path = None if path == "-" else path
        if kind == "time":
            result = time_worker(model, path, configs, args.warmup, args.iterations)
        else:
            result = memory_worker(model, path, configs[args.worker[3]], args.memory_iterations)
        print(json.dumps(result))
        return

    print(machine_info())
    load = OtherLoad()
    print(f"{args.iterations} timed iterations per configuration after {args.warmup} warm-up, "
          f"interleaved in one process per model; peak memory: a fresh process per "
          f"configuration, {args.memory_iterations} iteration(s), peak resident set (VmHWM) over "
          f"the built trainer's; peak*: the same with {TIGHT} (glibc returns each freed block of "
          f"64 KiB or more to the OS at once, so the peak follows the live tensors rather than "
          f"the allocator's cache); x = against {baseline}")
    common = ["--iterations", str(args.iterations), "--warmup", str(args.warmup),
              "--memory-iterations", str(args.memory_iterations), "--threads", str(args.threads)]
    for model in ("toy", "sd3") if args.model == "both" else (args.model,):
        with sd3_folder() if model == "sd3" else nullcontext("-") as path:
            times = run_worker(script, ["time", model, path, *common])
            peaks = {name: run_worker(script, ["mem", model, path, name, *common])
                     for name in configs}
            tight = {name: run_worker(script, ["mem", model, path, name, *common],
                                      env=dict([TIGHT.split("=")]))
                     for name in configs}
        print_table(model, times, peaks, tight, baseline)
    print("\n" + load.line())


def print_table(model: str, times: dict, peaks: dict, tight: dict, baseline: str) -> None:
    import statistics

    header = (f"{'configuration':<30} {'J':>2} {'nograd/it':>16} {'grad/it':>7} {'ms/it':>7} "
              f"{'x':>5} {'peak MB':>7} {'x':>5} {'peak* MB':>8} {'x':>5}")
    print(f"\n== {model}\n{header}\n{'-' * len(header)}")
    base_s = statistics.median(times[baseline]["seconds"])

    def memory(table: dict, name: str, width: int) -> str:
        peak, base = table[name]["peak_bytes"], table[baseline]["peak_bytes"]
        ratio = f"{peak / base:5.2f}" if base else f"{'n/a':>5}"
        return f"{peak / 2**20:{width}.1f} {ratio}"

    for name, t in times.items():
        seconds = statistics.median(t["seconds"])
        nograd = statistics.mean(t["nograd"])
        spread = f"{min(t['nograd']):.0f}-{max(t['nograd']):.0f}"
        nograd_text = f"{nograd:.0f}" + ("" if min(t["nograd"]) == max(t["nograd"])
                                         else f" ({spread})")
        print(f"{name:<30} {t['steps']:>2} {nograd_text:>16} {statistics.mean(t['grad']):7.0f} "
              f"{seconds * 1e3:7.0f} {seconds / base_s:5.2f} {memory(peaks, name, 7)} "
              f"{memory(tight, name, 8)}")
    if not all(p["reset"] for p in [*peaks.values(), *tight.values()]):
        print("(the peak could not be reset: it is ru_maxrss over the whole process)")
