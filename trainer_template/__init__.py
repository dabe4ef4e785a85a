"""The trainer every candidate runs in.

``interface`` is fixed (candidates never edit it); ``algorithm.py`` is the editable file copied into
every node of an archive; ``priors/`` holds the published mechanisms; ``proxy`` is the embedded CPU
backend and ``verl_backend`` the GPU-scale adapter.
"""

from pathlib import Path

TEMPLATE_DIR = Path(__file__).resolve().parent
ALGORITHM_FILE = TEMPLATE_DIR / "algorithm.py"
INTERFACE_FUNCTIONS = ("compute_advantages", "policy_loss")
