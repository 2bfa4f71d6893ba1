"""The algorithm pieces, pure of the training run: rollout and replay of trajectories, the
batch, step selection, credit, views, enhancers, pruning, KL estimators, the reference policy,
EMA, and the three registries of ``advantages/``, ``losses/`` and ``objectives/``.

Nothing here imports the config, the run folder or the trainer (docs/design.md, "Layers")."""
