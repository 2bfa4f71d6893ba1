"""Score rewards in the background so that reward computation overlaps the next rollout.

Threads, not processes: the heavy parts of every reward here run in code that releases the GIL
(torch kernels, onnxruntime sessions, HTTP waits for a remote reward), so a thread gets real
parallelism with the sampler while sharing the already loaded reward models, the CUDA context
and the tensors without pickling or copying them between processes.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .base import Reward, RewardOutput
from .media import Media


class AsyncReward:
    """Run ``reward`` on a thread pool.

    Args:
        reward: any reward callable.
        workers: concurrent scoring threads. 1 (default) keeps one batch in flight while the
            trainer samples the next; more only help rewards that wait on I/O (``remote``) or
            whose model is safe to call from several threads at once.
        copy: clone the media tensor on submit, so the trainer may reuse its buffers at once.

    ``submit(media, prompts, metadata)`` returns a ``Future``; ``future.result()`` is the
    :class:`RewardOutput` (or re-raises the reward's exception). Calling the object scores
    synchronously. Use as a context manager, or call :meth:`close`, to stop the threads.
    """

    def __init__(self, reward: Reward, workers: int = 1, copy: bool = True) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.reward = reward
        self.copy = copy
        self.groupwise = bool(getattr(reward, "groupwise", False))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")

    def submit(self, media: Media, prompts: list[str], metadata: list[dict]) -> Future:
        """Start scoring; returns a ``Future`` whose ``result()`` is the ``RewardOutput``."""
        if self.copy:
            media = Media(media.kind, media.data.detach().clone(), media.sample_rate)
            prompts, metadata = list(prompts), [dict(m) for m in metadata]
        return self._pool.submit(self.reward, media, prompts, metadata)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        return self.submit(media, prompts, metadata).result()

    def close(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait``, finish the batches already submitted."""
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> AsyncReward:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
