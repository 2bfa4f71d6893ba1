"""``python -m flowgrpo.cli``: the ``flowgrpo`` command (what ``accelerate launch -m`` runs)."""

import sys

from flowgrpo.cli.main import main

sys.exit(main())
