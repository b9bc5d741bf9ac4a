"""The value head's kinds (policy/value_fitters.py): the ridge head's closed form against a
direct solve, its cross-validated penalty, and the registry the config names."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch

from factor_cli.policy.value_fitters import (
    RIDGE_PENALTIES,
    VALUE_HEADS,
    HeadSettings,
    RidgeHead,
    _cv_penalty,
    _solve,
)
from factor_cli.policy.value_head import TargetValueHead, ValueReplayBuffer
from factor_cli.train.config import ValueConfig

SETTINGS = HeadSettings(hidden=16, lr=1e-2, epochs=4, batch_size=32, standardize=True)


def test_the_closed_form_matches_an_augmented_least_squares_solve() -> None:
    """min |Zw + c - y|^2 + lambda |w|^2 (c unpenalised) == lstsq on [Z 1; sqrt(lambda) I 0]."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        n, h, lam = 40, 6, float(rng.choice(RIDGE_PENALTIES))
        z, y = rng.normal(size=(n, h)), rng.normal(size=n)
        a = np.block([[z, np.ones((n, 1))], [np.sqrt(lam) * np.eye(h), np.zeros((h, 1))]])
        want = np.linalg.lstsq(a, np.r_[y, np.zeros(h)], rcond=None)[0]
        w, c = _solve(torch.tensor(z), torch.tensor(y), lam)
        assert np.allclose(w.numpy(), want[:h], atol=1e-9) and abs(float(c) - want[h]) < 1e-9


def test_cross_validation_picks_the_least_held_out_error() -> None:
    rng = np.random.default_rng(1)
    z = torch.tensor(rng.normal(size=(100, 8)))
    y = z[:, 0] + 0.1 * torch.tensor(rng.normal(size=100))
    fold = torch.arange(100) % 5

    def error(lam: float) -> float:
        out = 0.0
        for f in range(5):
            w, c = _solve(z[fold != f], y[fold != f], lam)
            out += float(((z[fold == f] @ w + c - y[fold == f]) ** 2).sum())
        return out

    assert _cv_penalty(z, y) == min(RIDGE_PENALTIES, key=error)


def test_ridge_fits_a_small_backbones_features_and_polyak_carries_it() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(400, 8, generator=g)
    y = 0.5 * x[:, 0] + 0.2
    buf = ValueReplayBuffer()
    buf.add(1, 2.0 + 0.01 * x, y)  # a backbone's scale: offsets ~1, spread ~0.01
    fitter = VALUE_HEADS.get("ridge")(8, SETTINGS)
    heads = TargetValueHead(fitter.head, tau=0.5)
    mse = fitter.fit(buf, g)
    assert mse < 1e-3 and float(((fitter.head(2.0 + 0.01 * x) - y) ** 2).mean()) == pytest.approx(
        mse
    )
    heads.update()  # the target moves halfway towards the fitted buffers
    assert torch.allclose(heads.target.weight, 0.5 * fitter.head.weight)
    assert fitter.state_dict() == {}


def test_a_ridge_targets_polyak_average_is_the_average_of_predictions() -> None:
    """Two fits on differently scaled buffers; after tau-averaging the target predicts
    tau V_old + (1 - tau) V_new at any features (a linear head, folded onto raw features)."""
    g = torch.Generator().manual_seed(4)
    x = 2.0 + 0.01 * torch.randn(300, 8, generator=g, dtype=torch.float64)
    fitter = VALUE_HEADS.get("ridge")(8, SETTINGS)
    first = ValueReplayBuffer()
    first.add(1, x.float(), (100 * (x[:, 0] - 2)).float())
    fitter.fit(first, g)
    heads = TargetValueHead(fitter.head, tau=0.7)
    heads.target.load_state_dict(fitter.head.state_dict())
    probe = 2.0 + 0.03 * torch.randn(50, 8, generator=g)  # beyond the buffers' spread
    old = heads.target(probe).double()
    second = ValueReplayBuffer()
    second.add(2, (3.0 + 0.2 * (x - 2)).float(), (5 * (x[:, 1] - 2)).float())
    fitter.fit(second, g)
    heads.update()
    want = 0.7 * old + 0.3 * fitter.head(probe).double()
    torch.testing.assert_close(heads.target(probe).double(), want, atol=1e-4, rtol=1e-5)
    # The fit is the z-scored closed form, folded: the same predictions as solving on z.
    h, y = (t.double() for t in second.tensors())
    mu, sd = h.mean(0), h.std(0)
    w, c = _solve((h - mu) / sd, y, _cv_penalty((h - mu) / sd, y))
    torch.testing.assert_close(
        fitter.head(probe).double(), ((probe.double() - mu) / sd) @ w + c, atol=1e-4, rtol=1e-5
    )


def test_every_kind_fits_through_the_same_interface() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, 8, generator=g)
    buf = ValueReplayBuffer()
    buf.add(1, x, x[:, 1])
    for name in VALUE_HEADS.names():
        fitter = VALUE_HEADS.get(name)(8, SETTINGS)
        assert fitter.fit(buf, torch.Generator().manual_seed(0)) < float(x[:, 1].var())
        assert fitter.head(x).shape == (200,)
        fitter.load_state_dict(fitter.state_dict())
    with pytest.raises(ValueError, match="empty"):
        VALUE_HEADS.get("ridge")(8, SETTINGS).fit(ValueReplayBuffer(), g)
    with pytest.raises(ValueError, match="RidgeHead expects"):
        RidgeHead(8)(torch.zeros(2, 3))


def test_the_config_offers_exactly_the_registered_kinds() -> None:
    allowed = typing.get_args(ValueConfig.model_fields["head"].annotation)
    assert sorted(allowed) == sorted(VALUE_HEADS.names())
