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
finalization at all, so there is nothing to abort.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run(main: Callable[..., Any], *args: Any) -> None:
    """``main(*args)``, then the process group destroyed (the module docstring says why)."""
    import torch.distributed as dist

    try:
        main(*args)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
