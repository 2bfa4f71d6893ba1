"""The training run: the loop (``trainer``), the model setup and hub checks, the reward runner,
evaluation and model-call accounting."""
