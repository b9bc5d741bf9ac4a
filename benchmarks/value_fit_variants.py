"""The value estimators ``benchmarks/value_fit.py fit`` compares, on one collected data set.

Every variant fits on single-continuation targets of the fit trajectories' states (as the
trainer's value head sees them: one continuation return per (state, draw)) and is scored on the
held-out trajectories' states against their K-continuation mean over the turns left (the
return TAC's credit needs). The variants move one lever at a time from the smoke preset's head
(last-layer boundary features, MLP hidden 64, Adam lr 1e-3, 4 passes, batch 64, targets played
for at most 6 turns).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from factor_cli.stats.calibration import value_ceiling, value_metrics

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Variant:
    name: str
    estimator: str = "head"  # head | linear | turn | encoder
    targets: int = 1000
    horizon: str = "6"  # "6": success within 6 more turns, "rest": within the turns left
    layer: int = -1
    hidden: int = 64
    lr: float = 1e-3
    epochs: int = 4
    init: str = "policy"  # the encoder's start: policy | scratch
    standardize: bool = False  # value.standardize: z-scores with the buffer's statistics
    turn_feature: bool = False  # append a one-hot of the state's turn index to its features
    features: str = "boundary"  # value.features: boundary (``layer``) | prompt_mean (all layers)
    per_state: int = 0  # draws per fit state (targets / per_state states); 0: ceil(targets / F)


BASE = Variant("smoke head (targets ~1,000)")
VARIANTS = [
    replace(BASE, name="smoke head, ~100 targets (one smoke step)", targets=100),
    BASE,
    replace(BASE, name="smoke head, ~8,500 targets (paper warm-up)", targets=8500),
    replace(BASE, name="horizon: the turns left", horizon="rest"),
    replace(BASE, name="horizon rest, ~8,500 targets", horizon="rest", targets=8500),
    replace(BASE, name="16 passes, lr 3e-3", horizon="rest", targets=8500, epochs=16, lr=3e-3),
    replace(BASE, name="hidden 256", horizon="rest", targets=8500, hidden=256),
    replace(BASE, name="hidden 1024 (paper)", horizon="rest", targets=8500, hidden=1024),
    *[replace(BASE, name=f"layer {i}", horizon="rest", targets=8500, layer=i) for i in range(4)],
    replace(BASE, name="standardised features", standardize=True),
    replace(BASE, name="standardised, ~100 targets", standardize=True, targets=100),
    replace(BASE, name="standardised, horizon rest", standardize=True, horizon="rest"),
    replace(
        BASE,
        name="standardised, rest, ~8,500 targets",
        standardize=True,
        horizon="rest",
        targets=8500,
    ),
    replace(
        BASE,
        name="standardised, rest, ~8,500, hidden 256",
        standardize=True,
        horizon="rest",
        targets=8500,
        hidden=256,
    ),
    replace(
        BASE,
        name="standardised, rest, ~8,500, 16 passes",
        standardize=True,
        horizon="rest",
        targets=8500,
        epochs=16,
    ),
    replace(
        BASE,
        name="standardised, rest, ~8,500, layer 2",
        standardize=True,
        horizon="rest",
        targets=8500,
        layer=2,
    ),
    replace(BASE, name="linear probe (ridge)", estimator="linear", horizon="rest", targets=8500),
    replace(BASE, name="ridge, ~1,000 targets", estimator="linear", horizon="rest"),
    replace(
        BASE,
        name="ridge, ~500 targets (the smoke warm-up)",
        estimator="linear",
        horizon="rest",
        targets=500,
    ),
    replace(BASE, name="ridge, ~100 targets", estimator="linear", horizon="rest", targets=100),
    replace(BASE, name="ridge, horizon 6, ~1,000 targets", estimator="linear"),
    replace(BASE, name="turn index alone", estimator="turn", horizon="rest", targets=8500),
    replace(
        BASE,
        name="ridge + turn index (one-hot)",
        estimator="linear",
        horizon="rest",
        targets=8500,
        turn_feature=True,
    ),
    replace(
        BASE,
        name="ridge + turn index, ~500 targets",
        estimator="linear",
        horizon="rest",
        targets=500,
        turn_feature=True,
    ),
    *[
        replace(
            BASE,
            name=f"prompt mean (every layer), ridge, ~{n:,} targets",
            estimator="linear",
            horizon="rest",
            targets=n,
            features="prompt_mean",
        )
        for n in (100, 500, 1000, 8500)
    ],
    replace(
        BASE,
        name="prompt mean, ridge + turn index, ~8,500 targets",
        estimator="linear",
        horizon="rest",
        targets=8500,
        features="prompt_mean",
        turn_feature=True,
    ),
    replace(BASE, name="prompt mean, smoke head", horizon="rest", features="prompt_mean"),
    replace(
        BASE,
        name="prompt mean, standardised, ~8,500 targets",
        horizon="rest",
        targets=8500,
        standardize=True,
        features="prompt_mean",
    ),
    # Distinct states against continuations per state, prompt-mean ridge: the trainer's warm-up
    # and steps draw B = 2 checkpoints x M = 2 continuations a root; B = 4 x M = 1 costs the same.
    *[
        replace(
            BASE,
            name=f"prompt mean, ridge, {n // m} states x {m}",
            estimator="linear",
            horizon="rest",
            targets=n,
            features="prompt_mean",
            per_state=m,
        )
        for n, m in ((512, 1), (512, 2), (512, 4), (256, 1), (1024, 2), (1024, 4), (2048, 16))
    ],
    replace(BASE, name="separate encoder, from the policy", estimator="encoder", horizon="rest"),
    replace(
        BASE,
        name="separate encoder, from scratch",
        estimator="encoder",
        horizon="rest",
        init="scratch",
    ),
]


def _split(data: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fit and held-out state indices: a quarter of the trajectories held out (seeded)."""
    traj = data["traj"].numpy()
    ids = np.unique(traj)
    rng = np.random.default_rng(seed)
    held = set(rng.choice(ids, size=max(1, len(ids) // 4), replace=False).tolist())
    mask = np.array([t in held for t in traj])
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def _returns(data: dict[str, Any], horizon: str) -> np.ndarray:
    """G per (state, continuation), [N, K]: the outcome, or 0 when the win came after 6 turns."""
    g = data["outcome"].numpy().astype(float)
    if horizon == "6":
        g = g * (data["length"].numpy() <= data["horizon"])
    return g


def _targets(fit: np.ndarray, g: np.ndarray, n: int, seed: int,
             per_state: int = 0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``n`` (state, single-continuation return) pairs: m draws of each of up to ceil(n / m) fit
    states (F of them), continuations without replacement; m = ``per_state``, or ceil(n / F)."""
    rng = np.random.default_rng(seed)
    m = min(g.shape[1], per_state or math.ceil(n / len(fit)))
    wanted = math.ceil(n / m) if per_state else n
    states = rng.permutation(fit)[: min(len(fit), wanted)]
    rows, ys = [], []
    for s in states:
        for c in rng.permutation(g.shape[1])[:m]:
            rows.append(s)
            ys.append(g[s, c])
    return np.array(rows[:n]), np.array(ys[:n])


def _head(x: torch.Tensor, y: torch.Tensor, v: Variant, seed: int) -> nn.Module:
    """The trainer's own head kind (``value.head``: mlp or ridge), fitted by its fitter on a
    replay buffer of the targets, with the variant's settings."""
    from factor_cli.policy.value_fitters import VALUE_HEADS, HeadSettings
    from factor_cli.policy.value_head import ValueReplayBuffer

    torch.manual_seed(seed)
    kind = "ridge" if v.estimator == "linear" else "mlp"
    settings = HeadSettings(v.hidden, v.lr, v.epochs, 64, v.standardize)
    fitter = VALUE_HEADS.get(kind)(x.shape[1], settings)
    buffer = ValueReplayBuffer()
    buffer.add(0, x, y)
    fitter.fit(buffer, torch.Generator().manual_seed(seed))
    return fitter.head.eval()


def _warm_start_path(data: dict[str, Any]) -> Path:
    """The warm start the data set was collected with; on a machine without it (a fresh clone)
    it is rebuilt from the smoke preset at the data's seed, into the same cache folder."""
    recorded = Path(data["model_path"])
    recorded = recorded if recorded.is_absolute() else REPO / recorded  # collect ran at the root
    if recorded.exists():
        return recorded
    from factor_cli.train.config import load_config
    from factor_cli.train.run import warm_start

    cfg = load_config("smoke", [f"seed={data['seed']}", "method=grpo", *data.get("overrides", [])])
    print(f"[fit] {recorded} is not here: building the seed-{data['seed']} warm start", flush=True)
    path = Path(warm_start(cfg, lambda *a: None, lambda m: print(m, flush=True))).resolve()
    if path.name != recorded.name:  # the cache key covers the env, SFT and seed settings
        raise SystemExit(f"the data set's warm start {recorded.name} differs from the smoke "
                         f"preset's {path.name}: collect the data set again")  # fmt: skip
    return path


def _encoder(data: dict[str, Any], rows: np.ndarray, y: np.ndarray, test: np.ndarray,
             v: Variant, seed: int) -> np.ndarray:  # fmt: skip
    """The tiny model's backbone (the warm start's weights, or re-initialised) + a linear head,
    trained end to end on each fit state's mean target (3 passes, Adam 3e-4, batch 16)."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(seed)
    path = _warm_start_path(data)
    if v.init == "scratch":  # the same architecture, randomly initialised (seeded above)
        backbone = AutoModel.from_config(AutoConfig.from_pretrained(path))
    else:
        backbone = AutoModel.from_pretrained(path)
    head = nn.Linear(backbone.config.hidden_size, 1)
    params = [*backbone.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=3e-4)
    states = np.unique(rows)
    target = {s: float(y[rows == s].mean()) for s in states}

    def forward(idx: np.ndarray) -> torch.Tensor:
        prompts = [data["prompts"][i] for i in idx]
        width = max(map(len, prompts))
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
        h = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        last = torch.tensor([len(p) - 1 for p in prompts])
        return head(h[torch.arange(len(idx)), last]).squeeze(-1)

    rng = np.random.default_rng(seed)
    for _ in range(3):
        for chunk in np.array_split(rng.permutation(states), max(1, len(states) // 16)):
            loss = nn.functional.mse_loss(forward(chunk), torch.tensor([target[s] for s in chunk]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return np.concatenate([forward(c).numpy() for c in np.array_split(test, len(test) // 32)])


def beyond_float16(feats: torch.Tensor, stored: torch.Tensor) -> int:
    """How many of ``feats`` differ from their float16 copy ``stored`` by more than its
    rounding (half the float16 spacing at x, which is <= eps * |x|): 0 when ``feats`` are what
    the data set's policy computed."""
    tolerance = torch.finfo(torch.float16).eps * stored.abs().clamp_min(2.0**-14)
    return int(((feats - stored).abs() > tolerance).sum())


def _boundary(data: dict[str, Any]) -> torch.Tensor:
    """Every layer's boundary state [N, L + 1, H] in float32, recomputed under the data set's
    warm start (once per fit). The data set stores them in float16 to stay small, which rounds
    a state's coordinates (order 1) by up to 1e-3 where states differ by 0.005-0.09 per
    dimension: enough to cost a probe on them several points of r. Where the warm start is not
    the one the data set was collected with (a rebuild need not give the same weights), the
    float16 copy is what the collecting policy computed, and it is used instead, with a
    warning."""
    if "boundary32" not in data:
        from transformers import AutoModelForCausalLM
        from value_fit import _features

        model = AutoModelForCausalLM.from_pretrained(_warm_start_path(data)).eval()
        with torch.no_grad():
            feats = _features(getattr(model, "model", model), data["prompts"])
        stored = data["features"].float()
        off = beyond_float16(feats, stored)
        if off:
            print(f"[fit] warning: {off} of {feats.numel()} boundary coordinates differ from the "
                  "data set's by more than float16 rounding: this warm start is not the one it "
                  "was collected with. The boundary rows read the data set's float16 copy, the "
                  "prompt-mean and encoder rows this warm start: not the committed numbers",
                  flush=True)  # fmt: skip
            feats = stored
        data["boundary32"] = feats
    return data["boundary32"]


def _prompt_mean(data: dict[str, Any]) -> torch.Tensor:
    """``value.features=prompt_mean`` of every state under the data set's warm start (computed
    once per fit: the data set stores the boundary states alone)."""
    if "prompt_mean" not in data:
        from transformers import AutoModelForCausalLM

        from factor_cli.rollout.values import prompt_mean_features

        model = AutoModelForCausalLM.from_pretrained(_warm_start_path(data))
        data["prompt_mean"] = prompt_mean_features(model, data["prompts"])
    return data["prompt_mean"]


def _predict(data: dict[str, Any], v: Variant, fit: np.ndarray, test: np.ndarray,
             seed: int) -> tuple[np.ndarray, int]:  # fmt: skip
    rows, y = _targets(fit, _returns(data, v.horizon), v.targets, seed, v.per_state)
    if v.estimator == "turn":
        turn = data["turn"].numpy()
        mean = {t: y[turn[rows] == t].mean() for t in np.unique(turn[rows])}
        return np.array([mean.get(t, y.mean()) for t in turn[test]]), len(y)
    if v.estimator == "encoder":
        return _encoder(data, rows, y, test, v, seed), len(y)
    feats = _prompt_mean(data) if v.features == "prompt_mean" else _boundary(data)[:, v.layer]
    if v.turn_feature:  # the trainer knows each state's turn; the 1M model's features barely do
        turn = data["turn"].long()
        feats = torch.cat([feats, nn.functional.one_hot(turn, int(turn.max()) + 1).float()], 1)
    head = _head(feats[rows], torch.tensor(y, dtype=torch.float32), v, seed)
    with torch.no_grad():
        return head(feats[test]).numpy(), len(y)


def _over_draws(data: dict[str, Any], v: Variant, fit: np.ndarray, test: np.ndarray,
                ref: np.ndarray, seed: int, first: np.ndarray, draws: int) -> str:  # fmt: skip
    """Pearson r's mean ± sd over ``draws`` target draws, ``first`` the prediction of draw
    ``seed`` (already fitted), the others refitted (n/a for the minutes-long encoders)."""
    if v.estimator == "encoder":
        return "n/a"
    preds = [first] + [_predict(data, v, fit, test, seed + d)[0] for d in range(1, draws)]
    rs = [np.corrcoef(p, ref)[0, 1] for p in preds]
    return f"{np.mean(rs):.2f} ± {np.std(rs, ddof=1):.2f}"


def group_baselines(data: dict[str, Any]) -> np.ndarray:
    """b of every state [N]: the mean outcome of its group's roots (its own trajectory's
    included), the baseline sign accuracy compares against (module docstring of value_fit)."""
    groups, outcomes = data["root_group"].numpy(), data["root_outcome"].numpy().astype(float)
    mean = {int(g): float(outcomes[groups == g].mean()) for g in np.unique(groups)}
    return np.array([mean[int(g)] for g in data["group"]])


def run_fit(path: Path, seed: int = 0, encoders: bool = True,
            draws: int = 1) -> list[dict[str, Any]]:  # fmt: skip
    """One row per :data:`VARIANTS` entry (the separate-encoder ones only with ``encoders``: they
    take minutes each), plus the reference's ceiling (module docstring). ``draws`` > 1 refits
    every variant but the encoders on that many target draws (seeds ``seed``, ``seed`` + 1, ...;
    the split fixed) and adds r's mean and standard deviation over them: the spread the single
    draw's CI, which resamples held-out trajectories alone, leaves out."""
    data = torch.load(path, weights_only=False)
    torch.set_num_threads(1)
    fit, test = _split(data, seed)
    ref_returns = _returns(data, "rest")[test]
    ref = ref_returns.mean(1)
    base = group_baselines(data)[test]
    cluster = data["traj"].numpy()[test]
    ceiling = value_ceiling(ref_returns, base, np.random.default_rng(seed))
    rows = []
    for v in (v for v in VARIANTS if encoders or v.estimator != "encoder"):
        t0 = time.perf_counter()
        pred, n = _predict(data, v, fit, test, seed)
        secs = time.perf_counter() - t0
        m = value_metrics(pred, ref, base, cluster, np.random.default_rng(seed), 500)
        rows.append({
            "variant": v.name, "targets": n, "held-out states": len(test),
            "r": m["pearson"].point, "r CI": f"[{m['pearson'].low:.2f}, {m['pearson'].high:.2f}]",
            "sign acc": m["sign_accuracy"].point, "bias": m["bias"].point, "mse": m["mse"].point,
            "seconds": secs, "ceiling r": ceiling.pearson, "ceiling sign": ceiling.sign_accuracy,
        })  # fmt: skip
        if draws > 1:
            rows[-1]["r over draws"] = _over_draws(data, v, fit, test, ref, seed, pred, draws)
        print(f"[fit] {v.name}: r {m['pearson'].point:.3f}, sign {m['sign_accuracy'].point:.3f}",
              flush=True)  # fmt: skip
    return rows
