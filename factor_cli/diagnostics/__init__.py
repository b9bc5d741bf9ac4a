"""The diagnostics that replay a run's kept policies (``factor diagnose td-sign``, ``value``,
``feedback``, ``token-perturb``): the paper's mechanism evidence played out again from restored
states. They sit above :mod:`factor_cli.train` (they load its checkpoints and configs and build
its generation backends), so train/ holds training alone; the tables they feed are pure
functions in :mod:`factor_cli.stats.diagnose`.

- :mod:`.replay`: a kept checkpoint's policy, the drawn actions, independent Monte-Carlo
  advantages (continuations from x_t and x_{t+1});
- :mod:`.td_sign`: the per-kept-step loop with its cache, and the td-sign / value estimates;
- :mod:`.feedback_probe`: a kept step's trajectories replayed and scored by the teacher under
  true, shuffled and no feedback;
- :mod:`.token_perturb`: the top and bottom allocation quartiles of drawn actions perturbed and
  played out.
"""
