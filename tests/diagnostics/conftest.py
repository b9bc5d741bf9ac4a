"""The replaying diagnostics' tests train tiny runs with the training tests' helpers
(``tests/train/test_train.py``: ``tiny_overrides``, ``needs_twx``), imported by module name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
