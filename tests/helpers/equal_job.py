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

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers package

from flowgrpo.config.io import load_config  # noqa: E402
from flowgrpo.distributed import unwrap  # noqa: E402
from flowgrpo.training.trainer import Trainer  # noqa: E402
from helpers.jobs import run  # noqa: E402


def main(out: str, batch: int, epochs: int = 2, resume: bool = False) -> None:
    cfg = load_config(None, [f"run.output_dir={out}", f"train.batch_size={batch}",
                             "train.group_size=4", f"run.epochs={epochs}", "run.eval_every=0",
                             "run.save_every=0", "run.tensorboard=false", "run.progress=false",
                             "data.eval_images_per_prompt=1", "sampler.num_steps=6"])
    t = Trainer.from_config(cfg, resume="auto" if resume else None)
    record: dict[str, torch.Tensor] = {}
    sample, advantages = t.sample, t.advantages

    def recorded_sample(epoch):
        b = sample(epoch)
        record[f"{epoch}.noise"] = t.acc.gather(b.traj.latents[:, 0].contiguous()).cpu()
        record[f"{epoch}.final"] = t.acc.gather(b.traj.final.contiguous()).cpu()
        record[f"{epoch}.reward"] = t.acc.gather(b.reward.scores.to(t.acc.device)).cpu()
        record[f"{epoch}.groups"] = t.acc.gather(b.groups.to(t.acc.device)).cpu()
        return b

    def recorded_advantages(b):
        adv, metrics = advantages(b)
        record[f"{b.iteration}.advantages"] = t.acc.gather(adv.contiguous()).cpu()
        return adv, metrics

    t.sample, t.advantages = recorded_sample, recorded_advantages
    t.train()
    names = [n for n, p in unwrap(t.adapter.transformer).named_parameters() if p.requires_grad]
    record.update({f"weight.{n}": p.detach().cpu() for n, p in zip(names, t.params)})
    record["world"] = torch.tensor(t.world)
    if t.acc.is_main_process:
        save_file({k: v.contiguous() for k, v in record.items()}, f"{out}/record.safetensors")


if __name__ == "__main__":
    run(main, sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]),
        *(a == "resume" for a in sys.argv[4:5]))
