"""Model-family adapters: ``pipelines.load(family, path_or_id, **options)``."""

from .base import FAMILIES, Cond, FlowAdapter, load, names, register

__all__ = ["FAMILIES", "Cond", "FlowAdapter", "load", "names", "register"]
