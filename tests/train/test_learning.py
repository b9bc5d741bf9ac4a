"""Learning, kept shown: GRPO, SERL-Repro and FACTOR each make a tiny policy better on a tiny
task within a fixed number of steps, judged by greedy eval success against the starting policy
on the same items (the main job's paired bootstrap, whose interval must exclude 0).

The task: TextWorldExpress coin games with three rooms and a 3-turn limit, under valid-action
decoding, from the untrained tiny model (no warm start). Its greedy play wins none of the 60
eval items; after 8 steps each method's wins 0.58-0.62 of them (docs/learning.md). Fixed
seeds, one thread: the result is the same on every run of one machine. Mutations checked by
hand when this test was written (each made every method fail): the loss's sign flipped in
``credit.losses``, and every coefficient zeroed.

Run alone with ``pytest -m learning`` (94 s for the three on two workers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from factor_cli.envs import availability
from factor_cli.train.config import load_config
from factor_cli.train.evaluate import paired_comparison, play_evaluation

pytestmark = [
    pytest.mark.learning,
    pytest.mark.skipif(availability("twx") is not None, reason=f"twx: {availability('twx')}"),
]

COIN3 = "numLocations=3,numDistractorItems=0,includeDoors=0"
STEPS = 8
EVAL_ITEMS = 60


def learning_overrides(model: Path, tmp: Path, method: str) -> list[str]:
    """The tiny task and its fixed protocol (steps, eval items, seeds)."""
    return [
        f"method={method}",
        f"steps={STEPS}",
        "seed=3",
        f"model.path={model}",
        "model.init_tiny=null",
        "sft.enabled=false",
        f"env.options.params.coin={COIN3}",
        "env.max_turns=3",
        "rollout.groups=4",
        "rollout.k=4",
        "rollout.max_new_tokens=12",
        "continuations.horizon=3",
        "optim.lr=1e-3",
        "credit.warmup_steps=1",
        "credit.anneal_steps=4",
        "value.lr=1e-3",
        "value.epochs=4",
        "value.tau=0.5",
        f"eval.max_items={EVAL_ITEMS}",
        f"output_dir={tmp / 'runs'}",
        f"tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
    ]


@pytest.mark.parametrize("method", ["grpo", "serl-repro", "factor"])
def test_method_improves_a_tiny_policy(method: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", learning_overrides(tiny_model_dir, tmp_path, method))
    trainer = Trainer(cfg)
    try:
        start = play_evaluation(trainer.backend, cfg, method).items
        for _ in range(STEPS):
            trainer.train_step()
        final = play_evaluation(trainer.backend, cfg, method).items
    finally:
        trainer.close()
    cmp = paired_comparison(start, final, seed=cfg.seed, replicates=2000)
    ci = f"[{cmp.ci_low:+.3f}, {cmp.ci_high:+.3f}]"
    print(f"{method}: {cmp.start:.3f} -> {cmp.final:.3f}, CI {ci}")
    assert cmp.ci_low > 0, (method, cmp)
