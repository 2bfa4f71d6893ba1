"""The ``flowgrpo`` command: ``main`` parses the command line; ``catalogue`` lists every registry's
pieces; ``ablate``, ``report``, ``doctor`` and ``inference`` (sample, eval) are its commands."""

from flowgrpo.cli.main import main

__all__ = ["main"]
