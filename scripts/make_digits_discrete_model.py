"""Train the shipped discrete toy: one token model of 8x8 digits per token path.

    python scripts/make_digits_discrete_model.py                 # all three paths
    python scripts/make_digits_discrete_model.py --kind masked   # one of them

writes ``pipelines/toy/digits-discrete-<kind>/`` (``config.json`` and safetensors weights, about
0.4 MB each) from a fixed seed and prints the base model's ``digit`` reward, sampled with the
``ctmc`` sampler. Needs the shipped digit classifier for that evaluation. One to four minutes per
path on 2 CPU cores (the metric path learns slowest and trains longest).

scikit-learn's 8x8 digits are already tokens: the 64 pixel intensities ``0..16``. Each
:class:`~pipelines.digits_discrete.DigitTokenModel` is trained by the discrete flow-matching loss
(Gat et al. 2024, "Discrete Flow Matching"): ``t ~ U(0, 1)``, ``x_t ~ p_t(. | x1)`` by the path's
forward process (:meth:`~samplers.discrete.TokenPath.corrupt` at ``sigma = 1 - t``), and the
cross-entropy of the posterior logits at ``(x_t, sigma)`` against the clean tokens ``x1``. For the
masked path the loss counts the masked positions only (an unmasked token is its own posterior, so
the sampler never reads the model there); the uniform and metric paths count every token. The
digit label is dropped to the null label for 10% of the examples, so CFG works.

Training stops early on purpose (see ``STEPS``): the base models should score mid-range on the
``digit`` reward so that GRPO has room to raise it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.digits_discrete import (  # noqa: E402 (after the path fix-up above)
    NULL_LABEL,
    DigitTokenModel,
    save_model,
    token_path,
)
from pipelines.toy import digit_prompt  # noqa: E402
from reward_models.digits import load_digit_split  # noqa: E402
from samplers.discrete import PATHS  # noqa: E402

STEPS = {"masked": 300, "uniform": 600, "metric": 1500}  # base rewards 0.57 / 0.55 / 0.41
BATCH = 128
LR = 2e-3
LABEL_DROPOUT = 0.1
EVAL_SEEDS = tuple(range(8))
EVAL_STEPS = 10  # ctmc steps of the base-reward evaluation (configs/digits_discrete.yaml: 10)
TOY = Path(__file__).resolve().parents[1] / "pipelines" / "toy"


def train(kind: str, steps: int, seed: int = 0, eval_every: int = 0) -> DigitTokenModel:
    """A :class:`DigitTokenModel` trained on the ``kind`` path; deterministic on CPU for a given
    ``seed`` and thread count."""
    path = token_path(kind)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = DigitTokenModel(num_states=path.num_states)
    grids, labels, _, _ = load_digit_split()
    tokens = (grids * 16).round().long().reshape(len(grids), -1)  # intensities 0..16
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 50))
    model.train()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = torch.randint(len(tokens), (BATCH,), generator=gen)
        x1, label = tokens[idx], labels[idx]
        label = torch.where(torch.rand(BATCH, generator=gen) < LABEL_DROPOUT, NULL_LABEL, label)
        sigma = 1.0 - torch.rand(BATCH, generator=gen)  # t ~ U(0, 1)
        x_t = path.corrupt(x1, sigma, generator=gen)
        logits = model(x_t, sigma, label)
        ce = F.cross_entropy(logits.reshape(-1, path.num_states), x1.reshape(-1),
                             reduction="none").reshape(x1.shape)
        if kind == "masked":  # only masked tokens are predicted by the sampler
            weight = (x_t == path.mask_id).float()
            loss = (ce * weight).sum() / weight.sum().clamp_min(1.0)
        else:
            loss = ce.mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        warmup.step()
        if step % 100 == 0 or step == steps:
            line = (f"{kind} step {step}/{steps} loss {loss.item():.4f} "
                    f"({time.perf_counter() - start:.0f} s)")
            if eval_every and step % eval_every == 0:
                model.eval()
                line += f" reward {evaluate(model, kind)}"
                model.train()
            print(line, flush=True)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def evaluate(model: DigitTokenModel, kind: str, num_steps: int = EVAL_STEPS,
             guidance: float = 1.0) -> float:
    """Mean ``digit`` reward over digits 0-9 x ``EVAL_SEEDS`` (80 samples), sampled with the
    ``ctmc`` sampler from fixed per-image seeds, as training's evaluation does."""
    import samplers
    from flowgrpo.training.evaluation import generate
    from pipelines.digits_discrete import DigitsDiscreteAdapter
    from reward_models import Media
    from reward_models.digits import digit_reward

    adapter = DigitsDiscreteAdapter(model=model, path=kind)
    digits = [d for d in range(10) for _ in EVAL_SEEDS]
    prompts = [digit_prompt(d) for d in digits]
    seeds = [1000 * d + s for d in range(10) for s in EVAL_SEEDS]
    images = generate(adapter, lambda p, m: adapter.encode(p), prompts, seeds, num_steps,
                      guidance, len(prompts), sampler=samplers.build("ctmc"))
    out = digit_reward()(Media("image", images), prompts, [{"digit": d} for d in digits])
    return round(out.scores.mean().item(), 4)


def main() -> None:
    """Train, save each folder (replacing an old one), and report the base rewards."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=(*PATHS, "all"), default="all")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: STEPS of the path)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=0, help="print rewards while training")
    parser.add_argument("--out", type=Path, default=None,
                        help="model folder (one --kind only; default pipelines/toy/...)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads; the weights differ in the last bits between counts")
    args = parser.parse_args()
    kinds = PATHS if args.kind == "all" else (args.kind,)
    if args.out is not None and len(kinds) > 1:
        parser.error("--out needs a single --kind")
    torch.set_num_threads(args.threads)
    for kind in kinds:
        start = time.perf_counter()
        model = train(kind, args.steps or STEPS[kind], args.seed, args.eval_every)
        seconds = time.perf_counter() - start
        out = args.out or TOY / f"digits-discrete-{kind}"
        save_model(model, str(out), kind)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"{kind}: trained in {seconds:.0f} s; wrote {out} ({size / 1e6:.2f} MB)")
        for guidance in (1.0, 3.0):
            print(f"  base digit reward (digits 0-9 x seeds {EVAL_SEEDS[0]}-{EVAL_SEEDS[-1]}, "
                  f"{EVAL_STEPS} ctmc steps, guidance {guidance}): "
                  f"{evaluate(model, kind, EVAL_STEPS, guidance)}", flush=True)


if __name__ == "__main__":
    main()
