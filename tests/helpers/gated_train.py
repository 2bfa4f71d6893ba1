"""``flowgrpo train`` that cannot end before the test lets it: ``python gated_train.py GATE
train ...`` runs the command in this process, and before the run's last epoch it writes
``GATE/held`` and waits until ``GATE/open`` exists.

The kill tests stop a run at a point of their choosing and count on the run still being alive
then; without the gate, a run that finishes before the kill lands makes the count depend on
timing. A SIGINT or SIGTERM that arrives while the run waits at the gate acts as it does after
an epoch (:meth:`~flowgrpo.training.trainer.Trainer.check_signals`): a checkpoint of the epochs
done, one line, exit 130 or 143.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def hold_before_the_last_epoch(gate: Path) -> None:
    """Make every trainer of this process wait at ``gate`` before its last epoch."""
    from flowgrpo.training.trainer import Trainer

    epoch = Trainer.epoch

    def gated(self, index: int, bar) -> dict:
        if index == self.cfg.run.epochs - 1:
            (gate / "held").touch()
            while not (gate / "open").exists() and not self.stop_signal:
                time.sleep(0.01)
            self.check_signals(index)  # raises when a signal came while held
        return epoch(self, index, bar)

    Trainer.epoch = gated


if __name__ == "__main__":
    from flowgrpo.cli.main import main

    hold_before_the_last_epoch(Path(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
