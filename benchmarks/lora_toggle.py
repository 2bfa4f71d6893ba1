"""What switching the LoRA off and on for a reference call costs, and what it could cost.

``flowgrpo.rl.reference.reference`` runs the reference (base) model with the LoRA switched off; the
``ratio`` objective does this once per trained step and minibatch when ``train.beta > 0``
(``benchmarks/overhead.py`` shows it as ``reference (LoRA off/on)``). Timed here, per use (entry
+ exit), on the toy's and the tiny SD3's transformer with the run's LoRA:

- ``reference()``: what the trainer does now: peft's public per-layer ``enable_adapters`` on
  the LoRA layers found once per model (it also flips ``requires_grad`` of the LoRA weights);
- diffusers' ``disable_adapters()`` / ``enable_adapters()``: what it did before; each walks every
  module and calls ``check_peft_version``;
- ``check_peft_version`` alone: it reads the installed peft's metadata through
  ``importlib.metadata`` each time;
- the ``_disable_adapters`` flag alone on the cached layers: what a forward reads (a private
  peft attribute; enough under ``torch.no_grad``, where the reference always runs).

All variants alternate in one process, ``--repeats`` uses each, median of ``--rounds`` rounds.

    python benchmarks/lora_toggle.py [--model toy|sd3|both] [--repeats 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _iteration import (  # noqa: E402
    build_trainer,
    machine_info,
    model_overrides,
    quiet,
    sd3_folder,
    set_threads,
)


def variants(trainer) -> dict[str, Callable[[], None]]:
    """One use (off, then on) of each way to switch the LoRA."""
    from diffusers.loaders.peft import MIN_PEFT_VERSION
    from diffusers.utils.peft_utils import check_peft_version

    from flowgrpo.distributed import unwrap
    from flowgrpo.rl.reference import lora_layers, reference

    model = unwrap(trainer.adapter.transformer)
    layers = lora_layers(model)  # the ones reference() switches

    def now() -> None:
        with reference(trainer.adapter):
            pass

    def diffusers_switch() -> None:
        model.disable_adapters()
        model.enable_adapters()

    def version() -> None:
        check_peft_version(min_version=MIN_PEFT_VERSION)
        check_peft_version(min_version=MIN_PEFT_VERSION)

    def flag() -> None:
        for layer in layers:
            layer._disable_adapters = True
        for layer in layers:
            layer._disable_adapters = False

    return {"reference() (now)": now, "diffusers disable/enable (before)": diffusers_switch,
            "  of it: check_peft_version x2": version, "cached layers, flag only": flag}


def run(model: str, path: str | None, repeats: int, rounds: int) -> None:
    from flowgrpo.distributed import unwrap

    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-") as tmp:
        trainer = build_trainer(model_overrides(model, path), tmp)
        modules = sum(1 for _ in unwrap(trainer.adapter.transformer).modules())
        table = variants(trainer)
        times: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(rounds):
            for name, use in table.items():
                start = time.perf_counter()
                for _ in range(repeats):
                    use()
                times[name].append((time.perf_counter() - start) / repeats)
        cfg = trainer.cfg
        trained = cfg.sampler.num_steps - 1
        print(f"\n== {model}: {modules} modules in the transformer; the ratio objective uses "
              f"reference() {trained} times per iteration here (one per trained step, one "
              f"minibatch)")
        now = statistics.median(times["reference() (now)"])
        for name, values in times.items():
            ms = statistics.median(values) * 1e3
            print(f"{name:<34} {ms:8.3f} ms per use  ({ms / (now * 1e3):5.2f} x now; "
                  f"{ms * trained:6.1f} ms per iteration)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("toy", "sd3", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=100, help="uses per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (median)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    set_threads(args.threads)
    quiet()
    print(machine_info())
    for model in ("toy", "sd3") if args.model == "both" else (args.model,):
        with sd3_folder() if model == "sd3" else nullcontext() as path:
            run(model, path, args.repeats, args.rounds)


if __name__ == "__main__":
    main()
