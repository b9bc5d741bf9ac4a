"""Stale against recomputed features on the fixed data set of ``benchmarks/value_fit.py``.

The trainer's replay buffer keeps each target with the feature of its state as computed when
the target was collected, under that step's weights (``policy.value_head``); the head is then
read at the current step's features. After k policy updates a buffer entry's feature is k
steps stale. ``value_fit.py stale`` measures what that costs a head, with the targets held
fixed so that only the features move:

1. the smoke preset (its own method, seed and warm start: the data set's) trains for
   ``--steps`` steps, as ``factor train`` does, and after every step (and before the first)
   the data set's states are read again under the current weights: the boundary state (last
   layer) and the prompt mean of every layer (``value.features``);
2. each head of :data:`HEADS` (the smoke preset's MLP, and ridge heads on either feature) is
   fitted on the fit trajectories' single-continuation targets, ~1,000 of them (ten smoke
   steps' worth, what the 10-step buffer holds), and scored on the held-out states against
   their 16-continuation mean, at steps k in ``CHECKPOINTS``, four ways: fitted and read at
   step 0's features (nothing stale); fitted at step 0's and read at step k's (**stale**: the
   oldest entries of a buffer); fitted on features each from one of the steps k - 9..k and read
   at step k's (**buffer**: what the trainer's replay buffer holds); fitted and read at step
   k's (**recomputed**: the buffer's features refreshed under the current weights).

The targets are the warm start's returns throughout: the policy's value moves as it trains,
which is a drift of the targets, not of the features, and is not measured here. ``drift`` is
the features' movement against their spread across states:
mean_n ||h_n^(k) - h_n^(0)|| / mean_n ||h_n^(0) - mean_m h_m^(0)||, and ``shift share`` how
much of it moves every state alike: ||mean_n h_n^(k) - mean_n h_n^(0)|| over the numerator.
Each fit here starts afresh; the trainer's MLP carries its weights from step to step and credit
reads a Polyak average of it, which this does not imitate (the ridge head refits from scratch
in the trainer too).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import value_fit_variants as vfv

from factor_cli.stats.calibration import value_metrics

CHECKPOINTS = (1, 3, 6, 12)
TARGETS = 1000
REPLAY = 10  # value.replay_steps: the current step and the 9 before
RESAMPLES = 500


def _read(model: Any, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Both feature kinds of ``prompts`` under ``model``'s current weights."""
    from value_fit import _features

    from factor_cli.rollout.values import prompt_mean_features

    model.eval()
    backbone = getattr(model, "model", model)
    return {
        "boundary": _features(backbone, prompts)[:, -1],
        "prompt_mean": prompt_mean_features(model, prompts),
    }


def train_and_read(data: dict[str, Any], steps: int, out: Path) -> dict[int, dict]:
    """Both feature kinds of every state before the smoke preset's run and after each of its
    ``steps`` steps, {step: {kind: [N, width]}} (saved to ``out``, reused when there)."""
    if out.exists():
        print(f"[stale] reusing {out}", file=sys.stderr)
        return torch.load(out, weights_only=False)
    from factor_cli.atomic import atomic_target
    from factor_cli.train.config import load_config
    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", [f"seed={data['seed']}", *data.get("overrides", [])])
    trainer = Trainer(cfg, str(vfv._warm_start_path(data)))
    model, prompts = trainer.policy.model, data["prompts"]
    feats, t0 = {}, time.perf_counter()
    try:
        for k in range(steps + 1):
            if k:
                res = trainer.train_step()
                print(f"[stale] {cfg.method} step {k}/{steps}: success "
                      f"{res.metrics.get('success_rate', float('nan')):.2f} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)  # fmt: skip
            with torch.no_grad():  # every step's: the buffer simulation reads them all
                feats[k] = _read(model, prompts)
            model.train()
            print(f"[stale] features after step {k} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr)  # fmt: skip
    finally:
        trainer.close()
    with atomic_target(out) as tmp:
        torch.save(feats, tmp)
    return feats


def _drift(h0: torch.Tensor, hk: torch.Tensor) -> tuple[float, float]:
    """(drift, the share of it a common shift of every state explains)."""
    spread = (h0 - h0.mean(0)).norm(dim=1).mean()
    moved = (hk - h0).norm(dim=1).mean()
    shift = (hk.mean(0) - h0.mean(0)).norm()
    return float(moved / spread), float(shift / moved)


@dataclass(frozen=True)
class Head:
    name: str
    features: str
    variant: vfv.Variant


HEADS = [
    Head("shipped MLP, boundary", "boundary", replace(vfv.BASE, horizon="rest")),
    Head("ridge, boundary", "boundary", replace(vfv.BASE, estimator="linear", horizon="rest")),
    Head("ridge, prompt mean", "prompt_mean",
         replace(vfv.BASE, estimator="linear", horizon="rest")),
]  # fmt: skip


def _fit_read(head: Head, fit_x: torch.Tensor, y: np.ndarray, read_x: torch.Tensor,
              seed: int) -> np.ndarray:  # fmt: skip
    fitted = vfv._head(fit_x, torch.tensor(y, dtype=torch.float32), head.variant, seed)
    with torch.no_grad():
        return fitted(read_x).numpy()


def _buffer_features(feats: dict[int, dict], kind: str, rows: np.ndarray, k: int,
                     seed: int) -> torch.Tensor:  # fmt: skip
    """The trainer's buffer at step k: each target's feature as computed at one of the steps
    max(0, k - 9)..k (drawn uniformly, seeded), the step its target would have come from."""
    window = np.arange(max(0, k - REPLAY + 1), k + 1)
    born = np.random.default_rng(seed + k).choice(window, size=len(rows))
    return torch.stack([feats[int(b)][kind][r] for b, r in zip(born, rows)])


def _paired_r_gap(a: np.ndarray, b: np.ndarray, ref: np.ndarray, cluster: np.ndarray,
                  rng: np.random.Generator) -> tuple[float, float, float]:  # fmt: skip
    """r(a, ref) - r(b, ref) with a 95% interval over resampled held-out trajectories."""
    labels = np.unique(cluster, return_inverse=True)[1]
    members = [np.flatnonzero(labels == c) for c in range(labels.max() + 1)]
    gaps = []
    for _ in range(RESAMPLES):
        d = np.concatenate([members[c] for c in rng.integers(0, len(members), len(members))])
        gaps.append(np.corrcoef(a[d], ref[d])[0, 1] - np.corrcoef(b[d], ref[d])[0, 1])
    point = np.corrcoef(a, ref)[0, 1] - np.corrcoef(b, ref)[0, 1]
    low, high = np.nanpercentile(gaps, [2.5, 97.5])
    return float(point), float(low), float(high)


def run_stale(data: dict[str, Any], feats: dict[int, dict], seed: int = 0) -> list[dict]:
    """One row per (head, checkpoint step k): the features' drift, and held-out r of the head
    fitted and read four ways (module docstring; ``buffer``: :func:`_buffer_features`)."""
    off = vfv.beyond_float16(feats[0]["boundary"], data["features"][:, -1].float())
    if off:
        print(f"[stale] warning: {off} boundary coordinates at step 0 differ from the data set's "
              "by more than float16 rounding: the warm start is not the one the data set was "
              "collected with (its plays are another policy's), so these are not the committed "
              "numbers", file=sys.stderr)  # fmt: skip
    fit, test = vfv._split(data, seed)
    returns = vfv._returns(data, "rest")
    ref = returns[test].mean(1)
    rows, y = vfv._targets(fit, returns, TARGETS, seed)
    base = vfv.group_baselines(data)[test]
    cluster = data["traj"].numpy()[test]

    def metrics(pred: np.ndarray) -> dict[str, Any]:
        return value_metrics(pred, ref, base, cluster, np.random.default_rng(seed), RESAMPLES)

    out = []
    for head in HEADS:
        h0 = feats[0][head.features]
        r0 = metrics(_fit_read(head, h0[rows], y, h0[test], seed))["pearson"].point
        for k in (s for s in CHECKPOINTS if s in feats):
            hk = feats[k][head.features]
            buffered = _buffer_features(feats, head.features, rows, k, seed)
            preds = {
                "stale": _fit_read(head, h0[rows], y, hk[test], seed),
                "buffer": _fit_read(head, buffered, y, hk[test], seed),
                "recomputed": _fit_read(head, hk[rows], y, hk[test], seed),
            }
            m = {name: metrics(p) for name, p in preds.items()}
            gap = _paired_r_gap(preds["recomputed"], preds["buffer"], ref, cluster,
                                np.random.default_rng(seed))  # fmt: skip
            drift, shift = _drift(h0, hk)
            row = {"head": head.name, "step": k, "drift": drift, "shift share": shift,
                   "r step 0": r0}  # fmt: skip
            for name, mm in m.items():
                row[f"r {name}"] = mm["pearson"].point
                row[f"r {name} CI"] = _ci(mm["pearson"])
            row["recomputed - buffer"] = gap[0]
            row["gap CI"] = f"[{gap[1]:+.2f}, {gap[2]:+.2f}]"
            row.update({f"bias {name}": mm["bias"].point for name, mm in m.items()})
            out.append(row)
            print(f"[stale] {head.name}, step {k}: r stale {row['r stale']:.2f}, buffer "
                  f"{row['r buffer']:.2f}, recomputed {row['r recomputed']:.2f}",
                  file=sys.stderr)  # fmt: skip
    return out


def _ci(iv: Any) -> str:
    return f"[{iv.low:.2f}, {iv.high:.2f}]"
