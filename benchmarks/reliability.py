"""What reliability costs: step time on 2 processes versus 1, and checkpoint size and write time.

    python benchmarks/reliability.py                 # both parts
    python benchmarks/reliability.py --part processes --epochs 12
    python benchmarks/reliability.py --part checkpoints --repeats 5

- ``processes``: the toy job (the default config, ``sampler.num_steps`` 10, groups of 8) with a
  global batch of 32, once in 1 process (``train.batch_size: 32``) and once in 2 processes under
  ``accelerate launch`` (16 each), the same computation (``tests/e2e/test_processes.py``). Reported:
  the median ``time/step`` over the epochs after the first, and the ratio 2-process / 1-process.
  On a 2-core machine the two processes share the cores, so the ratio measures the overhead of
  DDP (gradient all-reduce, the gathers of rewards, advantages and masks) against the halved
  work per process.
- ``checkpoints``: a checkpoint of the toy job (LoRA rank 16) and of a tiny SD3 pipeline built
  in code (LoRA rank 8, and full fine-tuning): the folder's size, the median time to write it
  (gather, safetensors, manifest hashes, atomic rename) and to verify its manifest.

The machine is shared and noisy: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOY = ["train.group_size=8", "run.eval_every=0", "run.save_every=0", "run.tensorboard=false",
       "run.progress=false", "data.eval_images_per_prompt=1"]


def step_times(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["time/step"] for r in rows if "time/step" in r][1:]  # the first epoch warms up


def processes(epochs: int) -> None:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world, batch in ((1, 32), (2, 16)):
            run = Path(tmp) / f"world{world}"
            sets = [a for s in [*TOY, f"train.batch_size={batch}", f"run.epochs={epochs}",
                                f"run.output_dir={run}"] for a in ("--set", s)]
            launch = [sys.executable]
            if world > 1:
                launch += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                           str(world), "--num_machines", "1", "--mixed_precision", "no",
                           "--dynamo_backend", "no", "--main_process_port", "29531"]
            subprocess.run([*launch, "-m", "flowgrpo.cli", "train", *sets], check=True,
                           capture_output=True, cwd=ROOT)
            out[world] = statistics.median(step_times(run))
    print(f"toy job, global batch 32, {epochs} epochs: time/step 1 process {out[1]:.3f} s, "
          f"2 processes {out[2]:.3f} s, ratio 2/1 = {out[2] / out[1]:.2f}")


def checkpoint_cost(name: str, overrides: list[str], repeats: int) -> None:
    from flowgrpo.config.io import load_config
    from flowgrpo.run import checkpoint as ckpt
    from flowgrpo.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer.from_config(load_config(None, [*TOY, f"run.output_dir={tmp}",
                                                   "run.keep_checkpoints=1", *overrides]))
        writes, checks = [], []
        for step in range(1, repeats + 1):
            start = time.perf_counter()
            folder = t.save(step)
            writes.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert ckpt.verify(folder) is None
            checks.append(time.perf_counter() - start)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        files = ", ".join(sorted(p.name for p in folder.iterdir()))
    print(f"{name}: {size / 1e6:.2f} MB, write {statistics.median(writes) * 1e3:.0f} ms, "
          f"verify {statistics.median(checks) * 1e3:.0f} ms ({files})")


def checkpoints(repeats: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tiny import tiny_sd3_pipeline

    checkpoint_cost("toy (LoRA rank 16)", ["train.batch_size=16"], repeats)
    with tempfile.TemporaryDirectory() as tmp:
        tiny_sd3_pipeline().save_pretrained(tmp)
        sd3 = [f"model.path={tmp}", "model.options={}", "train.batch_size=16",
               "reward.name=jpeg_compressibility"]
        checkpoint_cost("tiny SD3 (LoRA rank 8)", [*sd3, "model.lora_rank=8"], repeats)
        checkpoint_cost("tiny SD3 (full fine-tuning)", [*sd3, "model.lora=false"], repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("processes", "checkpoints", "all"), default="all")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.part in ("processes", "all"):
        processes(args.epochs)
    if args.part in ("checkpoints", "all"):
        checkpoints(args.repeats)


if __name__ == "__main__":
    main()
