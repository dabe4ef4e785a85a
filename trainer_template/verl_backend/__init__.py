"""The verl adapter: a node's mechanism as a verl advantage estimator and policy loss.

``adapter`` wraps a node's ``compute_advantages`` / ``policy_loss`` in verl's signatures and registers
them; ``plugin`` is the module verl's processes import (``VERL_USE_EXTERNAL_MODULES`` /
``actor_rollout_ref.model.external_lib``) to register the node named by the environment; ``trainer``
routes the reward extras ``valid`` / ``correct`` to the estimator; ``reward`` is the reward function;
``data_prep`` writes the MATH L3-5 parquet; ``launch`` builds the hydra overrides of the protocol.
"""

ENV_NODE = "POISE_NODE_NAME"
ENV_ALGORITHM_FILE = "POISE_ALGORITHM_FILE"
ENV_HPARAMS = "POISE_HPARAMS"
REGISTERED_PREFIX = "poise_"


def registered_name(node: str) -> str:
    """The verl registry name of a node (prefixed: a node named ``grpo`` must not shadow verl's own)."""
    return REGISTERED_PREFIX + node
