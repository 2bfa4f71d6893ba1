"""One GRPO iteration against its transformer-call floor, with a per-phase breakdown.

An iteration is the work of ``Trainer.epoch`` (without logging): ``trainer.sample`` (prompt
encodings, rollout, decode, reward), ``views.extend``, ``trainer.advantages`` and
``trainer.update``, then ``calls.take``. The **floor** is the same transformer calls alone:
every call of the iteration replayed on the trainer's own transformer (LoRA on, the reference
ones with the LoRA off, exactly as ``flowgrpo.rl.reference.reference`` does)
with the very inputs the
iteration gave it (captured in the last warm-up iteration): the rollout's forwards without
gradient (same batch, same number of steps, the CFG batch doubled when there is CFG), the
reference and recompute forwards without gradient, and each training forward followed by a
backward from its output (same minibatch shapes, the same number of rows as ``calls/grad``),
fed the very gradient the iteration's loss gave that output (on CPU the backward's time depends
on the gradient's values: from ``ones_like`` it was 7x slower on the tiny SD3).

Inside the real iteration the transformer is timed too (a forward pre-hook and a forward hook
on it), and so are the trainer's phases and the functions they call (each wrapped by a timer
at run time; nothing in ``flowgrpo`` is edited). Every row of the breakdown is **own** time:
the wall time inside that function minus the time of the timed functions it called, so the
rows add up to the iteration. ``backward`` is ``accelerator.backward`` as a whole: the
transformer's backward plus the (small) backward of the sampler and loss arithmetic on top.

Iterations and floors alternate (iteration, floor, iteration, floor, ...) after ``--warmup``
iterations, so load from other processes hits both alike; every figure is a median over
``--iterations`` repetitions (rows are medians of their own, so they need not sum exactly);
``iteration / floor`` is the median of the per-pair ratios, and is given again in process CPU
time (``time.process_time``, which time spent preempted by other processes does not inflate) as
a cross-check on a busy machine. The last line says how much CPU other processes took.
On CUDA every timer first waits for the device's queued kernels (:func:`now`), so a time is
the kernels' own rather than their launch; the floor runs under the run's autocast, as the
iteration's calls do.

    python benchmarks/overhead.py [--model toy|sd3|both] [--iterations 10] [--warmup 2]
        [--threads 1] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flowgrpo.training.calls import _rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _iteration import (  # noqa: E402
    OtherLoad,
    build_trainer,
    iteration,
    machine_info,
    model_overrides,
    quiet,
    sd3_folder,
    set_threads,
)

FWD_NOGRAD = "transformer forward, no grad"
FWD_REF = "transformer forward, no grad, reference (LoRA off)"
FWD_GRAD = "transformer forward, grad"
BACKWARD = "backward (accelerator.backward)"
TRANSFORMER = (FWD_NOGRAD, FWD_REF, FWD_GRAD, BACKWARD)
Path_ = tuple[str, ...]


def now() -> float:
    """``time.perf_counter()`` once the device's queued work is done: CUDA kernels run
    asynchronously, so without the synchronize a timer would measure their launch, not their
    run. On the CPU it is ``perf_counter`` itself."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class Clock:
    """Own (exclusive) wall time per nested path of labels: a call's time minus its timed
    children's."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [label, start, children's time]
        self.own: dict[Path_, float] = {}
        self.on = True
        self.replaced: list[tuple[Any, str, Any]] = []  # (owner, name, own attribute or None)

    def enter(self, label: str) -> None:
        self.stack.append([label, now(), 0.0])

    def exit(self) -> None:
        label, start, children = self.stack.pop()
        elapsed = now() - start
        path = (*(frame[0] for frame in self.stack), label)
        self.own[path] = self.own.get(path, 0.0) + elapsed - children
        if self.stack:
            self.stack[-1][2] += elapsed

    @contextmanager
    def phase(self, label: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        self.enter(label)
        try:
            yield
        finally:
            self.exit()

    def take(self) -> dict[Path_, float]:
        """The own times collected since the last take."""
        own, self.own = self.own, {}
        return own

    def _remember(self, owner: Any, name: str) -> None:
        own = vars(owner).get(name) if hasattr(owner, "__dict__") else None
        self.replaced.append((owner, name, own))

    def restore(self) -> None:
        """Put back everything :meth:`wrap` and :meth:`wrap_context` replaced."""
        for owner, name, own in reversed(self.replaced):
            if own is None:
                delattr(owner, name)  # it was a class attribute: the instance's copy goes
            else:
                setattr(owner, name, own)
        self.replaced = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Replace ``owner.name`` (a function or method) by a timed one."""
        static = inspect.isclass(owner) and isinstance(inspect.getattr_static(owner, name),
                                                       staticmethod)
        original = getattr(owner, name)
        self._remember(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(label):
                return original(*args, **kwargs)

        setattr(owner, name, staticmethod(timed) if static else timed)

    def wrap_context(self, owner: Any, name: str, label: str) -> None:
        """Replace the context-manager factory ``owner.name`` by one whose ``__enter__`` and
        ``__exit__`` are timed (as ``label: enter`` and ``label: exit``)."""
        original = getattr(owner, name)
        self._remember(owner, name)

        @contextmanager
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with self.phase(f"{label}: enter"):
                manager = original(*args, **kwargs)
                value = manager.__enter__()
            try:
                yield value
            except BaseException as err:
                with self.phase(f"{label}: exit"):
                    if not manager.__exit__(type(err), err, err.__traceback__):
                        raise
            else:
                with self.phase(f"{label}: exit"):
                    manager.__exit__(None, None, None)

        setattr(owner, name, timed)


@dataclass
class Call:
    """One transformer call: its rows, whether it built a graph or ran on the reference (LoRA
    off), and (when captured) a copy of its inputs and of the gradient its output received."""

    rows: int
    grad: bool
    ref: bool
    args: tuple = ()
    kwargs: dict | None = None
    grad_output: torch.Tensor | None = None  # the gradient its output got in the iteration


def _detached_copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class TransformerProbe:
    """Hooks on the transformer: times every forward into ``clock`` (labelled by gradient mode
    and LoRA state) and lists the calls in ``calls``: their signature only, or with a copy of
    their inputs while ``capture`` is set."""

    def __init__(self, clock: Clock, transformer: torch.nn.Module) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.clock = clock
        self.capture = False
        self.calls: list[Call] = []
        self.lora = next((m for m in transformer.modules() if isinstance(m, BaseTunerLayer)),
                         None)
        self.handles = [transformer.register_forward_pre_hook(self._pre, with_kwargs=True),
                        transformer.register_forward_hook(self._post)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.clock.on:
            return
        grad = torch.is_grad_enabled()
        ref = self.lora is not None and bool(self.lora.disable_adapters)
        call = Call(_rows(args, kwargs), grad, ref)
        if self.capture:
            call.args = tuple(_detached_copy(a) for a in args)
            call.kwargs = {k: _detached_copy(v) for k, v in kwargs.items()}
        self.calls.append(call)
        self.clock.enter(FWD_GRAD if grad else FWD_REF if ref else FWD_NOGRAD)

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not self.clock.on:
            return
        self.clock.exit()
        first = output[0] if isinstance(output, (tuple, list)) else output
        call = self.calls[-1]
        if self.capture and call.grad and first.requires_grad:
            def keep(grad: torch.Tensor, call: Call = call) -> None:
                call.grad_output = grad.detach().clone()

            first.register_hook(keep)


def instrument(trainer: Any, clock: Clock) -> TransformerProbe:
    """Time the trainer's phases and the functions they call (see the module docstring)."""
    import pipelines.base
    import samplers
    from flowgrpo import distributed as engines
    from flowgrpo.distributed import unwrap
    from flowgrpo.rl import advantages, batch, rollout
    from flowgrpo.rl import replay as grpo
    from flowgrpo.rl.objectives import base as objective_base
    from flowgrpo.rl.objectives import likelihood_free

    adapter = trainer.adapter
    wraps: list[tuple[Any, str, str]] = [
        (trainer, "sample", "sample"),
        (trainer.views, "extend", "views.extend"),
        (trainer, "advantages", "advantages"),
        (trainer, "update", "update"),
        (trainer.session, "encode", "encode prompts (cached)"),
        (trainer.selection, "select", "step selection"),
        (trainer.selection, "weights", "step weights"),
        (adapter, "noise", "initial noise"),
        (trainer, "rollout", "rollout"),
        (adapter, "velocity", "adapter.velocity"),
        (trainer.sampler, "transition", "sampler transition"),
        (rollout, "step_noise", "step noise (per-sample generators)"),
        (samplers, "sample_next", "sample_next"),
        (samplers, "gaussian_log_prob", "Gaussian log-prob"),
        (adapter, "decode", "decode (VAE)"),
        (trainer.rewards, "submit", "reward"),
        (trainer.rewards, "collect", "reward collect"),
        (batch, "cat_trajectories", "concatenate trajectories"),
        (trainer.credit, "rewards", "credit"),
        (trainer.rewards, "for_advantages", "advantage inputs"),
        (engines, "gather_columns", "gather batch metadata"),
        (advantages, "compute_advantages", "compute_advantages"),
        (trainer.rewards, "metrics", "reward metrics"),
        (trainer, "prune", "prune"),
        (trainer.objective, "prepare", "objective.prepare"),
        (trainer.objective, "loss", "objective.loss"),
        (objective_base, "replay_step", "replay_step"),
        (trainer.acc, "backward", BACKWARD),
        (trainer, "step_optimizer", "step_optimizer"),
        (trainer.acc, "clip_grad_norm_", "clip_grad_norm_"),
        (trainer.optimizer, "step", "AdamW step"),
        (trainer.optimizer, "zero_grad", "zero_grad"),
        (trainer.objective, "after_update", "objective.after_update"),
        (pipelines.base.Cond, "index", "Cond.index"),
        (pipelines.base.Cond, "cat", "Cond.cat"),
    ]
    for owner, name, label in wraps:
        clock.wrap(owner, name, label)
    for owner, name, label in [(trainer.objective, "sampling", "objective.sampling"),
                               (grpo, "reference", "reference (LoRA off/on)"),
                               (likelihood_free, "reference", "reference (LoRA off/on)"),
                               (trainer.acc, "no_sync", "accelerator.no_sync")]:
        clock.wrap_context(owner, name, label)
    return TransformerProbe(clock, unwrap(trainer.adapter.transformer))


def floor(trainer: Any, calls: list[Call], clock: Clock) -> dict[str, float]:
    """Seconds of the captured calls replayed alone, by kind, under the run's autocast (as
    the iteration makes them); grads are cleared after."""
    from flowgrpo.distributed import unwrap
    from flowgrpo.rl.reference import reference

    transformer = unwrap(trainer.adapter.transformer)
    out = dict.fromkeys(TRANSFORMER, 0.0)
    clock.on = False
    try:
        with trainer.calls.paused(), trainer.session.autocast():
            for call in calls:
                with reference(trainer.adapter) if call.ref else nullcontext():
                    if call.grad:
                        start = now()
                        result = transformer(*call.args, **(call.kwargs or {}))[0]
                        middle = now()
                        grad = call.grad_output
                        result.backward(torch.zeros_like(result) if grad is None else grad)
                        out[FWD_GRAD] += middle - start
                        out[BACKWARD] += now() - middle
                    else:
                        with torch.no_grad():
                            start = now()
                            transformer(*call.args, **(call.kwargs or {}))
                            out[FWD_REF if call.ref else FWD_NOGRAD] += now() - start
    finally:
        clock.on = True
        for p in trainer.params:
            p.grad = None
    return out


def timed_iteration(trainer: Any, clock: Clock, epoch: int) -> tuple[float, float, dict, dict]:
    """``(seconds, CPU seconds, own times by path, calls)`` of one iteration."""
    clock.take()
    start, cpu = now(), time.process_time()
    with clock.phase("iteration"):
        calls = iteration(trainer, epoch)
    return now() - start, time.process_time() - cpu, clock.take(), calls


def inclusive(own: dict[Path_, float]) -> dict[Path_, float]:
    """Each path's own time plus its descendants'."""
    out: dict[Path_, float] = {}
    for path, t in own.items():
        for depth in range(1, len(path) + 1):
            out[path[:depth]] = out.get(path[:depth], 0.0) + t
    return out


def median_by_key(rows: list[dict]) -> dict:
    keys = {k for row in rows for k in row}
    return {k: statistics.median(row.get(k, 0.0) for row in rows) for k in keys}


def tree_order(paths: list[Path_], incl: dict[Path_, float]) -> list[Path_]:
    """Depth-first, children by descending inclusive time."""
    children: dict[Path_, list[Path_]] = {}
    for path in paths:
        children.setdefault(path[:-1], []).append(path)
    order: list[Path_] = []

    def visit(parent: Path_) -> None:
        for child in sorted(children.get(parent, []), key=lambda p: -incl.get(p, 0.0)):
            order.append(child)
            visit(child)

    visit(())
    return order


def report(model: str, trainer: Any, seconds: list[float], owns: list[dict],
           floors: list[dict], calls: dict, captured: list[Call], signatures_match: bool,
           top: int, cpu_ratios: list[float]) -> None:
    cfg = trainer.cfg
    it_ms = statistics.median(seconds) * 1e3
    own = median_by_key([{p: t * 1e3 for p, t in o.items()} for o in owns])
    incl = median_by_key([{p: t * 1e3 for p, t in inclusive(o).items()} for o in owns])
    in_iter = [sum(t for p, t in o.items() if p[-1] in TRANSFORMER) * 1e3 for o in owns]
    floor_ms = [sum(f.values()) * 1e3 for f in floors]
    floor_kind = median_by_key([{k: v * 1e3 for k, v in f.items()} for f in floors])
    ratios = [s * 1e3 / f for s, f in zip(seconds, floor_ms)]
    n_grad = sum(c.grad for c in captured)
    n_ref = sum(c.ref for c in captured)
    rows = {"grad": sum(c.rows for c in captured if c.grad),
            "nograd": sum(c.rows for c in captured if not c.grad)}

    print(f"\n== {model}: sampler {cfg.sampler.name} {cfg.sampler.num_steps} steps, batch "
          f"{cfg.train.batch_size} (groups of {cfg.train.group_size}), guidance "
          f"{cfg.model.guidance}, objective {cfg.train.objective}, step selection "
          f"{cfg.train.step_selection}, beta {cfg.train.beta}, LoRA r={cfg.model.lora_rank}")
    print(f"transformer calls per iteration: {len(captured)} ({len(captured) - n_grad - n_ref} "
          f"no-grad policy, {n_ref} reference, {n_grad} with grad); rows: calls/nograd "
          f"{calls['calls/nograd']:.0f} (replayed {rows['nograd']}), calls/grad "
          f"{calls['calls/grad']:.0f} (replayed {rows['grad']})"
          + ("" if signatures_match else "; WARNING: the calls changed between iterations"))
    print(f"iteration {it_ms:8.1f} ms   floor {statistics.median(floor_ms):8.1f} ms   "
          f"iteration / floor = {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} pairs); in CPU time "
          f"{statistics.median(cpu_ratios):.2f}")
    print(f"transformer time inside the iteration {statistics.median(in_iter):8.1f} ms "
          f"({100 * statistics.median(in_iter) / it_ms:.0f}% of it; in-iteration / floor = "
          f"{statistics.median(in_iter) / statistics.median(floor_ms):.2f}); everything else "
          f"{it_ms - statistics.median(in_iter):.1f} ms")
    print("floor by kind (ms): " + ", ".join(f"{k} {floor_kind[k]:.1f}" for k in TRANSFORMER))

    header = f"{'phase (own time; indented = called from the line above)':<66} {'ms':>8} {'%':>6}"
    print("\n" + header + f" {'incl ms':>8}")
    print("-" * (len(header) + 9))
    for path in tree_order(list(own), incl):
        name = "  " * (len(path) - 1) + path[-1]
        mark = " *" if path[-1] in TRANSFORMER else ""
        print(f"{(name + mark)[:66]:<66} {own[path]:8.1f} {100 * own[path] / it_ms:6.1f} "
              f"{incl[path]:8.1f}")
    print("(* transformer; 'iteration' own = calls.take and the glue between phases)")

    print(f"\nlargest non-transformer costs (own time, median of {len(owns)}):")
    ranked = sorted((p for p in own if p[-1] not in TRANSFORMER), key=lambda p: -own[p])
    for path in ranked[:top]:
        print(f"  {own[path]:8.1f} ms {100 * own[path] / it_ms:5.1f}%  {' > '.join(path[1:])}")
    phases = ("sample", "views.extend", "advantages", "update")
    print("\nby phase: transformer / everything else (ms):")
    for phase in phases:
        subtree = [p for p in own if len(p) > 1 and p[1] == phase]
        tr = sum(own[p] for p in subtree if p[-1] in TRANSFORMER)
        total = incl.get(("iteration", phase), 0.0)
        print(f"  {phase:<14} {total:8.1f} = transformer {tr:8.1f} + other {total - tr:8.1f}")


def run_model(model: str, sd3_path: str | None, iterations: int, warmup: int, top: int,
              overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-") as tmp:
        trainer = build_trainer([*model_overrides(model, sd3_path), *overrides], tmp)
        clock = Clock()
        probe = instrument(trainer, clock)
        try:
            epoch = 0
            for w in range(warmup):
                probe.calls, probe.capture = [], w == warmup - 1
                iteration(trainer, epoch)
                epoch += 1
            probe.capture = False
            clock.take()
            captured = probe.calls
            signature = [(c.rows, c.grad, c.ref) for c in captured]
            seconds, owns, floors, cpu_ratios, match = [], [], [], [], True
            calls: dict = {}
            for _ in range(iterations):
                probe.calls = []
                s, cpu, own, calls = timed_iteration(trainer, clock, epoch)
                match &= [(c.rows, c.grad, c.ref) for c in probe.calls] == signature
                epoch += 1
                seconds.append(s)
                owns.append(own)
                start = time.process_time()
                floors.append(floor(trainer, captured, clock))
                cpu_ratios.append(cpu / (time.process_time() - start))
        finally:  # the next model starts from the untimed functions
            clock.restore()
            probe.remove()
        report(model, trainer, seconds, owns, floors, calls, captured, match, top, cpu_ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("toy", "sd3", "both"), default="both")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations (and floors)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations first (>= 1)")
    parser.add_argument("--top", type=int, default=12, help="non-transformer costs to list")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override on top of the model's (repeatable)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default; see set_threads)")
    args = parser.parse_args()
    set_threads(args.threads)
    if args.warmup < 1 or args.iterations < 1:
        parser.error("--warmup and --iterations must be >= 1")
    quiet()
    print(machine_info())
    load = OtherLoad()
    for model in ("toy", "sd3") if args.model == "both" else (args.model,):
        with sd3_folder() if model == "sd3" else nullcontext() as path:
            run_model(model, path, args.iterations, args.warmup, args.top, args.set)
    print("\n" + load.line())

if __name__ == "__main__":
    main()
