"""One run of the toy job that records what every epoch computed, for the 1-process versus
2-process test: ``python equal_job.py OUT BATCH [EPOCHS [resume]]`` alone, or under
``accelerate launch``.

Rank 0 writes ``OUT/record.safetensors``: per epoch the gathered initial noise, final latents,
rewards and advantages (global order), and the trainable weights after the run. Ends its
process group through :func:`helpers.jobs.run` (a live gloo group at interpreter exit can abort
a rank; the reason is written there).
"""

import sys
from pathlib import Path

from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers package

from flowgrpo.config.io import load_config  # noqa: E402
from flowgrpo.training.trainer import Trainer  # noqa: E402
from helpers.jobs import recorded_training, run  # noqa: E402


def main(out: str, batch: int, epochs: int = 2, resume: bool = False) -> None:
    cfg = load_config(None, [f"run.output_dir={out}", f"train.batch_size={batch}",
                             "train.group_size=4", f"run.epochs={epochs}", "run.eval_every=0",
                             "run.save_every=0", "run.tensorboard=false", "run.progress=false",
                             "data.eval_images_per_prompt=1", "sampler.num_steps=6"])
    t = Trainer.from_config(cfg, resume="auto" if resume else None)
    record, _ = recorded_training(t)
    if t.acc.is_main_process:
        save_file({k: v.contiguous() for k, v in record.items()}, f"{out}/record.safetensors")


if __name__ == "__main__":
    run(main, sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]),
        *(a == "resume" for a in sys.argv[4:5]))
