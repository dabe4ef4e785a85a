"""The embedded CPU proxy: a tiny GPT learns chained mod-100 arithmetic, then is RL-trained with the
node's own ``compute_advantages`` / ``policy_loss`` and scored on held-out splits (docs/proxy.md).

Modules: ``task`` (problems, tokens, verifier), ``model`` (TinyGPT, KV-cache sampling), ``protocol``
(settings, presets, Overall), ``warmstart`` (cached supervised start), ``rl`` (the RL loop),
``evalset`` (held-out metrics), ``worker`` (the per-seed subprocess entry point).
"""
