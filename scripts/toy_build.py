"""What the scripts that train a shipped toy pipeline share: determinism while training, the
command line, and writing the folder.

Imported by those scripts as ``scripts.toy_build`` once they have put the repository root on
``sys.path``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


@contextmanager
def deterministic_and_quiet() -> Iterator[None]:
    """Deterministic algorithms on and diffusers' logging at errors only, for the duration.

    Training a toy indexes prompt embeddings, whose backward accumulates in a thread-dependent
    order otherwise; the short text lengths the toys use truncate prompts on purpose.
    """
    from diffusers.utils import logging

    deterministic, verbosity = torch.are_deterministic_algorithms_enabled(), logging.get_verbosity()
    torch.use_deterministic_algorithms(True)
    logging.set_verbosity_error()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        logging.set_verbosity(verbosity)


def toy_arguments(doc: str, out: str, vae_steps: int, flow_steps: int,
                  threads: int = 1) -> argparse.Namespace:
    """Parse the toy scripts' shared command line (steps, seed, eval interval, output folder,
    CPU threads) and set the thread count."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--vae-steps", type=int, default=vae_steps)
    parser.add_argument("--flow-steps", type=int, default=flow_steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=0, help="print rewards while training")
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--threads", type=int, default=threads,
                        help="CPU threads; the weights differ in the last bits between counts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def train_and_save(make: Callable[[int, int, int, int], Any], args: argparse.Namespace) -> Any:
    """``make(vae_steps, flow_steps, seed, eval_every)``, timed; the pipeline it returns replaces
    the folder ``args.out``. Prints the time and the folder's size; returns the pipeline."""
    start = time.perf_counter()
    pipe = make(args.vae_steps, args.flow_steps, args.seed, args.eval_every)
    seconds = time.perf_counter() - start
    if args.out.exists():
        shutil.rmtree(args.out)
    pipe.save_pretrained(args.out, safe_serialization=True)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"trained in {seconds:.0f} s; wrote {args.out} ({size / 1e6:.2f} MB)")
    return pipe
