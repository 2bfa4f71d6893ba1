"""How the multi-process jobs (``dist_job.py``, ``equal_job.py``, ``fsdp_job.py``, launched by
``accelerate launch``) end: :func:`run` calls a job's ``main`` and then destroys the process
group, on success and on an error alike.

Why: a gloo process group keeps C++ worker threads, and the work objects they hold keep tensors
that refer to Python objects. A process that ends with its group still alive leaves those to
interpreter finalization; releasing a tensor then takes the GIL of an interpreter that is being
torn down, and the rank dies in ``std::terminate`` ("terminate called without an active
exception", SIGABRT) after its work is done and written, so ``accelerate launch`` reports a
failure that depends on thread timing. ``destroy_process_group`` shuts every group down (its
threads joined) while the interpreter is whole.

It is called in ``finally`` and needs no peer: it is local to the process, so a rank whose
``main`` raised still ends cleanly and its own error is what the launcher reports (a peer left
waiting in a collective is ended by the launcher). Killed by a signal, a rank runs no
finalization at all, so there is nothing to abort. The FSDP2 job still aborted now and then with its
groups destroyed, so it ends with ``os._exit(0)`` once ``main`` returned (``hard_exit``): no
teardown or finalization runs at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run(main: Callable[..., Any], *args: Any, hard_exit: bool = False) -> None:
    """``main(*args)``, then the process group destroyed (the module docstring says why). With
    ``hard_exit``, a ``main`` that returned ends the process at once instead, with no teardown
    and no interpreter finalization: for a job whose every output is written and closed and
    whose ranks have met at a barrier when ``main`` returns."""
    import os
    import sys

    import torch.distributed as dist

    ok = False
    try:
        main(*args)
        ok = True
    finally:
        if ok and hard_exit:
            # Destroying the groups was not always enough for the FSDP2 job: its sharded state
            # holds gloo work objects whose threads could still abort the rank, in the teardown
            # or in finalization. Its outputs are written and closed and its ranks have met at a
            # last barrier, so the process ends here, with nothing torn down.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def recorded_training(trainer, first: str = "noise") -> tuple[dict, dict]:
    """Train ``trainer`` and record what every epoch computed: ``(record, last metrics row)``.

    ``record`` holds, per epoch, the gathered first states (``<epoch>.<first>``), final states,
    rewards, groups and advantages (global order), then the trainable weights after the run
    (``weight.<name>``) and the world size; it is what the 1-process versus 2-process tests
    compare."""
    import torch

    from flowgrpo.distributed import unwrap

    t = trainer
    record: dict[str, torch.Tensor] = {}
    sample, advantages = t.sample, t.advantages

    def recorded_sample(epoch):
        b = sample(epoch)
        record[f"{epoch}.{first}"] = t.acc.gather(b.traj.latents[:, 0].contiguous()).cpu()
        record[f"{epoch}.final"] = t.acc.gather(b.traj.final.contiguous()).cpu()
        record[f"{epoch}.reward"] = t.acc.gather(b.reward.scores.to(t.acc.device)).cpu()
        record[f"{epoch}.groups"] = t.acc.gather(b.groups.to(t.acc.device)).cpu()
        return b

    def recorded_advantages(b):
        adv, metrics = advantages(b)
        record[f"{b.iteration}.advantages"] = t.acc.gather(adv.contiguous()).cpu()
        return adv, metrics

    t.sample, t.advantages = recorded_sample, recorded_advantages
    row = t.train()
    names = [n for n, p in unwrap(t.adapter.transformer).named_parameters() if p.requires_grad]
    record.update({f"weight.{n}": p.detach().cpu() for n, p in zip(names, t.params)})
    record["world"] = torch.tensor(t.world)
    return record, row
