"""One run of the discrete toy job (configs/digits_discrete.yaml) that records what every epoch
computed, for the 1-process versus 2-process test: ``python discrete_equal_job.py OUT BATCH``
alone, or under ``accelerate launch``.

Rank 0 writes ``OUT/record.safetensors``: per epoch the gathered source tokens, final tokens,
rewards and advantages (global order), the eval reward, and the LoRA weights after the run.
Ends its process group through :func:`helpers.jobs.run` (see there why).
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers package

from flowgrpo.config.io import load_config  # noqa: E402
from flowgrpo.training.trainer import Trainer  # noqa: E402
from helpers.jobs import recorded_training, run  # noqa: E402

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "digits_discrete.yaml")


def main(out: str, batch: int) -> None:
    cfg = load_config(CONFIG, [f"run.output_dir={out}", f"train.batch_size={batch}",
                               "train.group_size=4", "run.epochs=2", "run.eval_every=2",
                               "run.save_every=0", "run.tensorboard=false", "run.progress=false",
                               "data.eval_images_per_prompt=2", "sampler.num_steps=6"])
    t = Trainer.from_config(cfg)
    record, row = recorded_training(t, first="source")
    record["eval_reward"] = torch.tensor(row["eval/reward"])
    if t.acc.is_main_process:
        save_file({k: v.contiguous() for k, v in record.items()}, f"{out}/record.safetensors")


if __name__ == "__main__":
    run(main, sys.argv[1], int(sys.argv[2]))
