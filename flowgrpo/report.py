"""``flowgrpo report RUN_DIR``: a PNG of reward and KL over steps (eval points marked) and a
short text summary."""

from __future__ import annotations

from pathlib import Path

from .tracking import read_metrics


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def report(run_dir: str | Path) -> str:
    """Write ``RUN_DIR/report.png`` and return the summary text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no rows yet")
    fig, (ax_r, ax_k) = plt.subplots(1, 2, figsize=(11, 4))
    x, y = _series(rows, "reward/mean")
    ax_r.plot(x, y, label="rollout reward (mean)", color="tab:blue")
    ex, ey = _series(rows, "eval/reward")
    ax_r.plot(ex, ey, "o-", label="eval reward (Euler, fixed seeds)", color="tab:orange")
    ax_r.set_xlabel("step")
    ax_r.set_ylabel("reward")
    ax_r.legend()
    ax_r.grid(alpha=0.3)
    kl_key = "train/kl" if any("train/kl" in r for r in rows) else "train/approx_kl"
    kx, ky = _series(rows, kl_key)
    ax_k.plot(kx, ky, color="tab:red")
    ax_k.set_xlabel("step")
    ax_k.set_ylabel(kl_key)
    ax_k.grid(alpha=0.3)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    png = run_dir / "report.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    lines = [f"run: {run_dir}", f"steps logged: {len(rows)} (last step {rows[-1]['step']})"]
    if y:
        lines.append(f"rollout reward: first {y[0]:.3f}, last {y[-1]:.3f}, max {max(y):.3f}")
    if ey:
        lines.append(f"eval reward: first {ey[0]:.3f} (step {ex[0]}), last {ey[-1]:.3f} "
                     f"(step {ex[-1]}), change {ey[-1] - ey[0]:+.3f}")
    if ky:
        lines.append(f"{kl_key}: last {ky[-1]:.3e}")
    times = [r["time/step"] for r in rows if "time/step" in r]
    if times:
        lines.append(f"time per step: {sum(times) / len(times):.2f} s")
    lines.append(f"plot: {png}")
    return "\n".join(lines)
