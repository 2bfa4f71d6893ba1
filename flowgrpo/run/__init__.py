"""What a run folder holds: checkpoints (``checkpoint``), resuming (``resume``) and the metrics
and media log (``tracking``)."""
