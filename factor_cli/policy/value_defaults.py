"""The one home of the value head's defaults (docs/design.md section 5.1), standard library only.

:mod:`factor_cli.policy.value_head` uses them as its arguments' defaults and the training
config's ``value.*`` fields take theirs from here, so each number is written once; the config
can read them without importing torch.
"""

from __future__ import annotations

VALUE_HIDDEN = 1024
"""D: hidden size of the 2-layer MLP (paper scale)."""
VALUE_LR = 1e-4
"""Adam learning rate of the online head."""
VALUE_TAU = 0.995
"""Polyak coefficient of the target head: phi_target <- tau phi_target + (1 - tau) phi."""
VALUE_REPLAY_STEPS = 10
"""Steps of Monte-Carlo targets kept in the replay buffer (the current and previous 9)."""
VALUE_EPOCHS = 1
"""Passes over the replay buffer per training step."""
VALUE_BATCH_SIZE = 256
"""Mini-batch size of the value regression."""
VALUE_WARMUP_ROLLOUTS = 0
"""Rollouts of the starting policy whose continuation targets fit the head before the first
policy update (0: none; the paper trains the head during its first W credit warm-up steps)."""
VALUE_WARMUP_EPOCHS = 8
"""Passes over the warm-up targets."""
VALUE_STANDARDIZE = False
"""Whether the head z-scores its features with the replay buffer's statistics (the paper: no)."""
VALUE_HEAD = "mlp"
"""The head's kind (``factor_cli.policy.value_fitters.VALUE_HEADS``): the paper's MLP."""
VALUE_FEATURES = "boundary"
"""What the head reads of x_t (``factor_cli.rollout.values.VALUE_FEATURES``): the paper's
last-layer hidden state at the boundary token."""
