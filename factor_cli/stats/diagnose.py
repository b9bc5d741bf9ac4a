"""The paper's mechanism diagnostics as tables over recorded actions (``factor diagnose``).

Every function takes the per-action frame of :mod:`factor_cli.rollout.action_records` (plus the
run columns ``run_id``, ``method``, ``env``, ``seed``) and returns a table, one row per method
(or per method and bucket), pooled over runs. No I/O.

- :func:`coef_deviation`: |w-bar_t - 1| per action (paper Fig. 5A, Table 18): its median and the
  share of actions over 10%, over the actions with non-zero credit of the teacher-active
  steps.
- :func:`group_signal`: per step, the share of groups with any non-zero A^seq and of actions with
  zero credit.
- :func:`value_against_mc`: V_target(x_t) against an independent N-continuation return
  (Table 17): MSE, MAE, bias, Pearson r and sign accuracy with bootstrap intervals and the
  reference's noise ceiling; :func:`value_reliability` its reliability curve.
- :func:`value_calibration`: V_target(x_t) against the continuations it was trained on.
- :func:`length_bias`: mean pre-clipping surrogate weight per token-count bucket under token-mean
  (L_t w-bar_t / L-bar) and action-mean (w-bar_t) (Table 24).
- :func:`horizon`: success by trajectory-length bucket (Table 26).
- :func:`credit_by_position`: the mean credit share A*_t / A^seq_i and the mean A*_t by turn,
  for successful and failed trajectories, with bootstrap intervals over trajectories.
- :func:`td_sign`: sign agreement of the credit with an independent Monte-Carlo advantage
  (Fig. 5B, Table 19), early and late, with a bootstrap interval over trajectories.
- :func:`feedback_concentration`: the allocation's concentration with true, shuffled and no
  feedback (Table 27).
- :func:`token_perturb`: the return change from perturbing the top vs the bottom quartile of
  the allocation, by credit sign, and the AUC (Fig. 5C, Tables 15-16).
- :func:`credit_agreement`: several estimators' credit on the same actions: pairwise sign
  agreement and Spearman rank correlation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

DEVIATION_THRESHOLD = 0.10
"""The paper's "share of actions over 10%" line of Table 18."""
LENGTH_EDGES = (6, 10, 16)
"""Upper edges of the paper's token-count quartiles: Q1 <= 6, Q2 7-10, Q3 11-16, Q4 >= 17."""
HORIZON_EDGES = (3, 6, 9)
"""Upper edges of the trajectory-length buckets (actions): <= 3, 4-6, 7-9, >= 10."""
RELIABILITY_BINS = 5
MIN_ABS = 1e-6


def _buckets(values: pd.Series, edges: tuple[int, ...]) -> pd.Series:
    """Label of each value's bucket: '1-6', '7-10', '11-16', '>=17' for edges (6, 10, 16)."""
    lo = [1, *[e + 1 for e in edges]]
    labels = [f"{lo[i]}-{e}" for i, e in enumerate(edges)] + [f">={lo[-1]}"]
    index = np.searchsorted(np.asarray(edges), values.to_numpy(), side="left")
    return pd.Series(pd.Categorical.from_codes(index, labels, ordered=True), index=values.index)


def active_steps(actions: pd.DataFrame) -> pd.DataFrame:
    """The rows of the teacher-active steps (allocation strength eta_k or alpha_k > 0) of each
    run, or all of a run's rows when it has none (a method without a teacher, or records written
    before the strength was recorded)."""
    if "strength" not in actions:
        return actions
    on = actions["strength"] > 0
    return actions[on | ~on.groupby(actions["run_id"]).transform("any")]


def by(frame: pd.DataFrame, *extra: str) -> list[str]:
    """The grouping of every table: method, and env when the frame has it (runs of one method
    on two environments are never pooled), then ``extra``."""
    return [c for c in ("method", "env") if c in frame.columns] + list(extra)


def credited(actions: pd.DataFrame) -> pd.DataFrame:
    """The actions with |A_t| >= 1e-6."""
    return actions[actions["credit"].abs() >= MIN_ABS]


def coef_deviation(actions: pd.DataFrame, per_seed: bool = False) -> pd.DataFrame:
    """Per method and env (and seed with ``per_seed``): actions, median |w-bar_t - 1|, mean,
    and the share over 10%, over the actions with non-zero credit of the active steps (an
    action with A_t = 0 contributes nothing to the loss, and SERL's multiplier is exactly 1
    there)."""
    a = credited(active_steps(actions)).assign(dev=lambda f: (f["wbar"] - 1.0).abs())
    g = a.groupby(by(a, *(["seed"] if per_seed else [])))["dev"]
    return pd.DataFrame(
        {
            "actions": g.size(),
            "median": g.median(),
            "mean": g.mean(),
            "share_over_10pct": g.apply(lambda d: float((d > DEVIATION_THRESHOLD).mean())),
        }
    ).reset_index()


def group_signal(actions: pd.DataFrame) -> pd.DataFrame:
    """Per method, env and step (pooled over runs): groups, share with any |A^seq| >= 1e-6, and
    the share of actions with |A_t| < 1e-6."""
    keys = by(actions, "step")
    traj = actions.drop_duplicates(["run_id", "step", "traj"])
    groups = (
        traj.assign(sig=traj["a_seq"].abs() >= MIN_ABS)
        .groupby([*keys, "run_id", "group"])["sig"]
        .any()
        .groupby(keys)
    )
    zero = (actions["credit"].abs() < MIN_ABS).groupby([actions[k] for k in keys])
    return pd.DataFrame(
        {"groups": groups.size(), "group_signal": groups.mean(), "zero_credit": zero.mean()}
    ).reset_index()


def value_calibration(
    actions: pd.DataFrame, continuations: pd.DataFrame, bins: int = RELIABILITY_BINS
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, reliability). Each checkpoint state x_t with continuations is one point:
    prediction V_target(x_t) (the action row's ``value``), target the mean of its continuations'
    returns. Summary per method and env: states, MSE, Pearson r (NaN when either side is
    constant). Reliability per method, env and prediction bin (equal width over the
    predictions' range): mean prediction, mean target, states."""
    keys = ["run_id", "step", "traj", "turn"]
    target = continuations.groupby(keys)["target"].mean().rename("target").reset_index()
    group = by(actions)
    points = actions.dropna(subset=["value"]).merge(target, on=keys)[[*group, "value", "target"]]
    points = points.astype({"value": float, "target": float})
    if points.empty:
        raise ValueError("no state has both a value and continuations")

    def summary(p: pd.DataFrame) -> pd.Series:
        v, y = p["value"].to_numpy(), p["target"].to_numpy()
        r = np.corrcoef(v, y)[0, 1] if len(p) > 1 and v.std() > 0 and y.std() > 0 else np.nan
        return pd.Series({"states": len(p), "mse": float(np.mean((v - y) ** 2)), "pearson": r})

    table = points.groupby(group)[["value", "target"]].apply(summary).reset_index()
    lo, hi = points["value"].min(), points["value"].max()
    width = (hi - lo) / bins if hi > lo else 1.0
    points["bin"] = np.minimum(((points["value"] - lo) / width).astype(int), bins - 1)
    curve = (
        points.groupby([*group, "bin"])
        .agg(prediction=("value", "mean"), target=("target", "mean"), states=("value", "size"))
        .reset_index()
    )
    return table, curve


def length_bias(actions: pd.DataFrame, edges: tuple[int, ...] = LENGTH_EDGES) -> pd.DataFrame:
    """Per method, env and token-count bucket: actions, mean surrogate weight under action-mean
    (w-bar_t) and token-mean (L_t w-bar_t / L-bar, L-bar the mean L_t of the run's step)."""
    mean_len = actions.groupby(["run_id", "step"])["length"].transform("mean")
    a = actions.assign(
        bucket=_buckets(actions["length"], edges),
        action_mean=actions["wbar"],
        token_mean=actions["length"] * actions["wbar"] / mean_len,
    )
    return (
        a.groupby(by(a, "bucket"), observed=True)
        .agg(
            actions=("wbar", "size"),
            action_mean=("action_mean", "mean"),
            token_mean=("token_mean", "mean"),
        )
        .reset_index()
    )


def horizon(actions: pd.DataFrame, edges: tuple[int, ...] = HORIZON_EDGES) -> pd.DataFrame:
    """Per method, env and trajectory-length bucket (T_i actions): trajectories and success rate of
    the recorded training episodes."""
    traj = actions.drop_duplicates(["run_id", "step", "traj"])
    traj = traj.assign(bucket=_buckets(traj["turns"], edges))
    return (
        traj.groupby(by(traj, "bucket"), observed=True)
        .agg(trajectories=("success", "size"), success=("success", "mean"))
        .reset_index()
    )


def horizon_differences(table: pd.DataFrame) -> pd.DataFrame:
    """From :func:`horizon`'s table: per env, bucket and pair of methods (a, b), a after b in
    name order, the success difference a - b (the paper's Table 26 reads FACTOR's gain by
    horizon off such a table); empty with a single method."""
    envs = [c for c in ("env",) if c in table.columns]
    rows = []
    for key, part in table.groupby([*envs, "bucket"], observed=True, sort=True):
        head = list(key) if isinstance(key, tuple) else [key]
        rate = part.set_index("method")["success"].sort_index()
        for i, a in enumerate(rate.index):
            for b in rate.index[:i]:
                rows.append([*head, f"{a} - {b}", float(rate[a] - rate[b])])
    return pd.DataFrame(rows, columns=[*envs, "bucket", "pair", "difference"])


POSITION_TURNS = 10
"""Turns t = 0..9 get a position each; later turns are pooled into one position '>=10'."""


def _positions(actions: pd.DataFrame, turns: int) -> pd.DataFrame:
    """Each action under its turn's position ('0', '1', ..., '>=turns'), and once more under
    'last' when it is its trajectory's last action (t = T_i - 1); ``position`` is an ordered
    categorical in that order."""
    labels = [*(str(t) for t in range(turns)), f">={turns}", "last"]
    code = np.minimum(actions["turn"].to_numpy(), turns)
    last = actions[actions["turn"] == actions["turns"] - 1]
    return pd.concat(
        [
            actions.assign(position=pd.Categorical.from_codes(code, labels, ordered=True)),
            last.assign(
                position=pd.Categorical.from_codes(
                    np.full(len(last), turns + 1), labels, ordered=True
                )
            ),
        ],
        ignore_index=True,
    )


def credit_by_position(
    actions: pd.DataFrame, seed: int = 0, turns: int = POSITION_TURNS
) -> pd.DataFrame:
    """Where the credit of successful and of failed trajectories goes, by turn.

    For action t of trajectory i (t = 0, ..., T_i - 1, 0-based as the records' ``turn``), with
    A*_t its credit (the method's ``credit``: TAC's TD residual, GRPO's broadcast A^seq_i, ...)
    and A^seq_i its trajectory's advantage, the credit share is

        s_t = A*_t / A^seq_i,   defined only when |A^seq_i| >= 1e-6.

    TAC conserves A^seq_i, so sum_t s_t = 1 over a trajectory: s_t > 0 means action t moves
    the way the outcome does (pushed up in a win, down in a loss), s_t < 0 against it. Uniform
    credit (w/o TAC) gives s_t = 1 / T_i; broadcast credit (GRPO, SERL) gives s_t = 1.

    Rows: one per method, env, ``result`` ('failure' or 'success', the records' ``success``
    flag) and ``position``: '0', ..., 'turns-1' (one turn each), '>=turns' (the later turns
    pooled) and 'last' (t = T_i - 1, where the terminal reward r_{T-1} lands; these actions
    are also counted at their own turn, so the 'last' row overlaps the others). Columns:

    - ``actions``, ``trajectories``: the actions in the cell and their trajectories;
    - ``share_actions``: those whose trajectory has |A^seq_i| >= 1e-6 (the share's actions);
    - ``share``, ``share_low``, ``share_high``: the mean s_t over them, with a 95% percentile
      interval from a bootstrap over trajectories (actions of one trajectory are resampled
      together); NaN when no action of the cell has a share;
    - ``uniform_share``: the mean of 1 / T_i over the same actions, what uniform credit would
      show at this position (a reference);
    - ``credit``, ``credit_low``, ``credit_high``: the mean A*_t over all the cell's actions,
      with its interval.

    Only the teacher-active steps count (:func:`active_steps`): for FACTOR those are the steps
    past warm-up, where the credit is TD rather than uniform; a method without a teacher keeps
    all its steps. Every column of the mean is action-weighted; within one turn each
    trajectory has one action, so it is also trajectory-weighted.

    ``actions``: the records' frame (``turn``, ``turns``, ``success``, ``a_seq``, ``credit``,
    ``run_id``, ``step``, ``traj``, the grouping columns of :func:`by`, ``strength``).
    ``seed`` seeds the bootstrap.
    """
    a = active_steps(actions)
    a = a.assign(result=np.where(a["success"].astype(bool), "success", "failure"))
    a = _positions(a, turns)
    has_share = a["a_seq"].abs() >= MIN_ABS
    a = a.assign(share=a["credit"] / a["a_seq"].where(has_share), uniform=1.0 / a["turns"])
    group = by(a, "result", "position")
    cols = [*group, "actions", "trajectories", "share_actions", "share", "share_low",
            "share_high", "uniform_share", "credit", "credit_low", "credit_high"]  # fmt: skip
    rows = []
    rng = np.random.default_rng(seed)
    for key, cell in a.groupby(group, sort=True, observed=True):
        cluster = cell.groupby(["run_id", "step", "traj"], sort=False).ngroup().to_numpy()
        credit = cell["credit"].to_numpy(float)
        on = cell["share"].notna().to_numpy()
        if on.any():
            share = cell["share"].to_numpy(float)[on]
            # Renumber the clusters that have a share 0..k-1, as the interval needs.
            kept = np.unique(cluster[on], return_inverse=True)[1]
            share_ci = _cluster_interval(share, kept, rng)
            means = [share.mean(), *share_ci, cell["uniform"].to_numpy(float)[on].mean()]
        else:
            means = [np.nan] * 4
        rows.append([*key, len(cell), int(cluster.max()) + 1, int(on.sum()), *means,
                     credit.mean(), *_cluster_interval(credit, cluster, rng)])  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


SIGN_RESAMPLES = 2000


def td_sign(estimates: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Sign agreement of the credit A_t with an independent Monte-Carlo advantage ``mc`` (paper
    Fig. 5B, Table 19): per method, env and phase (``early``, ``late``, and ``all``), the actions
    compared, the ties left out (mc = 0: the N returns from x_{t+1} and from x_t average the
    same, so neither sign is supported; a phase of ties alone has no share), and the share
    with sgn(A_t) = sgn(mc), with a 95%
    percentile interval from a bootstrap over trajectories (actions of one trajectory share
    its outcome, so they are resampled together), and the ``ceiling``: the agreement a
    perfect credit would reach against the N-sample reference
    (:func:`~.calibration.td_sign_ceiling`).

    ``estimates``: one row per action with ``credit``, ``mc``, ``phase``, ``method``, ``run_id``,
    ``step`` and ``traj``; actions with |A_t| < 1e-6 are left out, as in the paper.
    """
    frame = credited(estimates)
    group = by(frame)
    from .calibration import td_sign_ceiling

    cols = [*group, "phase", "actions", "ties", "agreement", "ci_low", "ci_high", "ceiling"]
    rows = []
    rng = np.random.default_rng(seed)
    for key, by_method in frame.groupby(group, sort=True):
        head = list(key) if isinstance(key, tuple) else [key]
        for phase in ("early", "late", "all"):
            part = by_method if phase == "all" else by_method[by_method["phase"] == phase]
            ties = int((part["mc"] == 0).sum())
            part = part[part["mc"] != 0]
            if part.empty:  # nothing compared: say how many ties there were
                if ties:
                    rows.append([*head, phase, 0, ties, np.nan, np.nan, np.nan, np.nan])
                continue
            agree = (np.sign(part["credit"]) == np.sign(part["mc"])).to_numpy(dtype=float)
            cluster = part.groupby(["run_id", "step", "traj"], sort=False).ngroup().to_numpy()
            low, high = _cluster_interval(agree, cluster, rng)
            has = {"q", "v", "samples"} <= set(part.columns)
            best = td_sign_ceiling(part["q"], part["v"], part["samples"]) if has else np.nan
            rows.append([*head, phase, len(part), ties, float(agree.mean()), low, high, best])
    return pd.DataFrame(rows, columns=cols)


def _cluster_interval(
    values: np.ndarray, cluster: np.ndarray, rng: np.random.Generator
) -> tuple[float, float]:
    """95% percentile interval of the mean of ``values``, resampling whole clusters."""
    k = int(cluster.max()) + 1
    sums = np.bincount(cluster, weights=values, minlength=k)
    counts = np.bincount(cluster, minlength=k).astype(float)
    draws = rng.multinomial(k, np.full(k, 1.0 / k), size=SIGN_RESAMPLES)
    means = (draws @ sums) / (draws @ counts)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def credit_agreement(replayed: pd.DataFrame, estimators: list[str]) -> pd.DataFrame:
    """Per method and env of the runs (one rollout set each) and pair (a, b) of ``estimators``
    (columns of ``replayed``: each estimator's A_t on the same actions): the actions both credited
    (|A| >= 1e-6 under both), the share of those with sgn(A^a_t) = sgn(A^b_t), and Spearman's
    rank correlation over all actions both estimators gave credit to (NaN when either is
    constant). Estimators with no credit on a method's runs (NaN) are left out of its pairs."""
    rows = []
    group = by(replayed)
    for key, part in replayed.groupby(group, sort=True):
        head = list(key) if isinstance(key, tuple) else [key]
        names = [e for e in estimators if part[e].notna().all()]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                x, y = part[a].to_numpy(float), part[b].to_numpy(float)
                both = (np.abs(x) >= MIN_ABS) & (np.abs(y) >= MIN_ABS)
                same = np.sign(x[both]) == np.sign(y[both])
                agree = float(same.mean()) if both.any() else np.nan
                rho = _spearman(x, y)
                rows.append([*head, a, b, len(part), int(both.sum()), agree, rho])
    cols = [*group, "estimator_a", "estimator_b", "actions", "both_credited", "sign_agree",
            "spearman"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the average ranks (ties share their mean rank)."""
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if len(x) < 2 or rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


FEEDBACK_ORDER = {"true": 0, "shuffled": 1, "none": 2}


def feedback_concentration(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method, env and feedback condition (paper Table 27), over the replayed actions of
    two or more tokens: actions, the mean top-quartile mass of rho (uniform: the mean of
    ceil(L/4)/L, column ``uniform_top_mass``), the mean normalised entropy H(rho) / log L
    (uniform: 1) and the mean |Delta| per token."""
    a = rows[rows["length"] > 1]
    if a.empty:
        raise ValueError("no replayed action has two or more tokens: concentration is trivial")
    a = a.assign(uniform=np.ceil(a["length"] / 4) / a["length"])
    table = (
        a.groupby(by(a, "condition"))
        .agg(
            actions=("top_mass", "size"),
            top_mass=("top_mass", "mean"),
            uniform_top_mass=("uniform", "mean"),
            entropy=("entropy", "mean"),
            gap_abs=("gap_abs", "mean"),
        )
        .reset_index()
    )
    order = table["condition"].map(FEEDBACK_ORDER)
    return table.assign(_o=order).sort_values([*by(table), "_o"]).drop(columns="_o")


def feedback_contrasts(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per method and env: the paired drop in top-quartile mass from true feedback to each other
    condition on the same actions (two or more tokens), with a 95% interval resampling whole
    trajectories, and that drop as a share of the true condition's distance above uniform
    (the share Table 27's shuffled control removes: (0.38 - 0.21) / (0.38 - uniform))."""
    a = rows[rows["length"] > 1]
    keys = [*by(a), *(c for c in ("run_id", "step") if c in a.columns), "traj", "turn"]
    wide = a.pivot_table(index=keys, columns="condition", values="top_mass",
                         aggfunc="first").reset_index()  # fmt: skip
    length = a.groupby(keys, as_index=False)["length"].first()
    wide = wide.merge(length, on=keys)
    wide["uniform"] = np.ceil(wide["length"] / 4) / wide["length"]
    rng = np.random.default_rng(seed)
    out = []
    for key, part in wide.groupby(by(wide), sort=True) if by(wide) else [((), wide)]:
        head = list(key) if isinstance(key, tuple) else [key]
        cluster = part.groupby(keys[: len(keys) - 1], sort=False).ngroup().to_numpy()
        above = float((part["true"] - part["uniform"]).mean())
        for other in (c for c in ("shuffled", "none") if c in part.columns):
            drop = (part["true"] - part[other]).to_numpy(float)
            low, high = _cluster_interval(drop, cluster, rng)
            share = float(drop.mean()) / above if above > 0 else np.nan
            out.append([*head, other, len(part), above, float(drop.mean()), low, high, share])
    cols = [*by(wide), "condition", "actions", "true_above_uniform", "drop", "ci_low",
            "ci_high", "drop_share"]  # fmt: skip
    return pd.DataFrame(out, columns=cols)


GAP_CONDITIONS = ("true", "shuffled", "none")


def teacher_gap(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per source of plays (and method and env where given): actions, the mean log-likelihood
    gain g^c_t the realised reply gets from each feedback condition
    (:mod:`factor_cli.diagnostics.teacher_gap`), and the paired contrasts true - shuffled and
    true - none with 95% intervals resampling whole plays, beside the share of actions whose
    true gain exceeds the shuffled one and the plays' mean outcome (``success``; NaN without an
    ``outcome`` column). A teacher that reads the feedback has true - shuffled
    above 0."""
    rng = np.random.default_rng(seed)
    keys = by(rows, "source")
    out = []
    for key, part in rows.groupby(keys, sort=True):
        head = list(key) if isinstance(key, tuple) else [key]
        plays = [c for c in ("run_id", "play") if c in part.columns]
        cluster = part.groupby(plays, sort=False).ngroup().to_numpy()
        means = [float(part[c].mean()) for c in GAP_CONDITIONS]
        contrasts = []
        for other in ("shuffled", "none"):
            diff = (part["true"] - part[other]).to_numpy(float)
            contrasts += [float(diff.mean()), *_cluster_interval(diff, cluster, rng)]
        wins = float((part["true"] > part["shuffled"]).mean())
        won = (float(part.groupby(plays, sort=False)["outcome"].first().mean())
               if "outcome" in part.columns else np.nan)  # fmt: skip
        out.append([*head, len(part), int(cluster.max()) + 1, won, *means, *contrasts, wins])
    cols = [*keys, "actions", "plays", "success", *(f"gain_{c}" for c in GAP_CONDITIONS),
            "true_minus_shuffled", "ci_low", "ci_high", "true_minus_none", "none_ci_low",
            "none_ci_high", "share_true_above"]  # fmt: skip
    return pd.DataFrame(out, columns=cols)


def token_perturb(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per method, env and credit sign (paper Fig. 5C, Tables 15-16): actions, the mean return
    change Delta G from perturbing the top and the bottom quartile of rho, the share of
    perturbed actions the environment did not list as admissible, and the AUC: over actions,
    P(Delta G_top < Delta G_bottom) + P(=) / 2 (0.5: the allocation's top tokens matter no
    more than its bottom ones; above 0.5: perturbing the top hurts more), beside the mean
    effect Delta G_bottom - Delta G_top; both with 95% intervals over trajectories."""
    a = rows.assign(sign=np.where(rows["credit"] > 0, "positive", "negative"))
    keys = [*by(a), "sign"]
    wide = a.pivot_table(index=[*keys, "run_id", "step", "traj", "turn"], columns="quartile",
                         values="delta", aggfunc="first").dropna().reset_index()  # fmt: skip
    if wide.empty:
        raise ValueError("no action was perturbed in both quartiles")
    score = (wide["top"] < wide["bottom"]) + 0.5 * (wide["top"] == wide["bottom"])
    table = (
        wide.assign(auc=score.astype(float))
        .groupby(keys)
        .agg(actions=("auc", "size"), delta_top=("top", "mean"),
             delta_bottom=("bottom", "mean"), auc=("auc", "mean"))
        .reset_index()
    )  # fmt: skip
    invalid = (~a["valid"].astype(bool)).groupby([a[k] for k in keys]).mean().rename("invalid")
    table = table.merge(invalid.reset_index(), on=keys)
    return table.merge(
        _perturb_intervals(wide.assign(auc=score.astype(float)), keys, seed), on=keys
    )


def _perturb_intervals(wide: pd.DataFrame, keys: list[str], seed: int) -> pd.DataFrame:
    """Per ``keys``: 95% intervals of the AUC and of the effect Delta G_bottom - Delta G_top
    (how much more perturbing the top quartile costs), resampling whole trajectories."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, part in wide.groupby(keys, sort=True):
        cluster = part.groupby(["run_id", "step", "traj"], sort=False).ngroup().to_numpy()
        effect = (part["bottom"] - part["top"]).to_numpy(float)
        head = list(key) if isinstance(key, tuple) else [key]
        rows.append([*head, *_cluster_interval(part["auc"].to_numpy(float), cluster, rng),
                     float(effect.mean()), *_cluster_interval(effect, cluster, rng)])  # fmt: skip
    return pd.DataFrame(rows, columns=[*keys, "auc_ci_low", "auc_ci_high", "effect",
                                       "effect_ci_low", "effect_ci_high"])  # fmt: skip


VALUE_METRICS = ("mse", "mae", "bias", "pearson", "sign_accuracy", "spread")
CALIBRATION_RESAMPLES = 1000


def _returns_matrix(column: pd.Series) -> np.ndarray:
    """The ";"-joined continuation returns of each row as [rows, N] (N equal across rows)."""
    parts = [[float(x) for x in str(s).split(";")] for s in column]
    if len({len(p) for p in parts}) != 1:
        raise ValueError("the states were replayed with different --samples; use one")
    return np.array(parts)


def group_baselines(actions: pd.DataFrame) -> pd.DataFrame:
    """b per (run, step, group): the mean outcome G_i of the group's root trajectories, one
    reference point per group for V~(x_0), the baseline the boundary conventions fix the first
    state's value to (under leave-one-out advantages V~(x_0) is the mean of the others)."""
    traj = actions.drop_duplicates(["run_id", "step", "traj"])
    b = traj.groupby(["run_id", "step", "group"])["outcome"].mean().rename("baseline")
    return b.reset_index()


def value_against_mc(estimates: pd.DataFrame, actions: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 17: V_target(x_t) (the action record's ``value``) against an independent Monte-Carlo
    return V^MC(x_t) (``v``: the mean of N continuations from x_t, never used for training), per
    method, env, phase (early, late, all) and metric (MSE, MAE, bias = mean(V - V^MC), Pearson r,
    sign accuracy of V - b against V^MC - b with b the group baseline, ties V^MC = b left
    out, and the spread of V against V^MC within each run's step), each with a 95% interval
    from a bootstrap over trajectories, and beside it the reference's noise ceiling
    (:mod:`.calibration`): ``reliability`` rho_N and, for r and sign accuracy, the best any
    estimator can reach against an N-sample reference; for the spread, the true values'.

    ``estimates``: the td-sign replay's rows (``value``, ``v``, ``v_returns``, ``group``,
    ``phase``, run columns); ``actions``: the runs' action records (for the baselines).
    """
    from .calibration import value_ceiling, value_metrics

    if "v_returns" not in estimates.columns:
        raise ValueError(
            "the cached Monte-Carlo estimates predate per-continuation returns (needed for the "
            "noise ceiling); delete the td-sign-estimates folder under --out, or use another --out"
        )
    frame = estimates.dropna(subset=["value"]).merge(
        group_baselines(actions), on=["run_id", "step", "group"]
    )
    if frame.empty:
        raise ValueError("no replayed state has a recorded value (a method with a value head)")
    rng = np.random.default_rng(seed)
    rows = []
    for key, part in frame.groupby(by(frame), sort=True):
        head = list(key) if isinstance(key, tuple) else [key]
        for phase in ("early", "late", "all"):
            p = part if phase == "all" else part[part["phase"] == phase]
            if p.empty:
                continue
            pred, ref, base = (p[c].to_numpy(dtype=float) for c in ("value", "v", "baseline"))
            cluster = p.groupby(["run_id", "step", "traj"], sort=False).ngroup().to_numpy()
            block = p.groupby(["run_id", "step"], sort=False).ngroup().to_numpy()
            got = value_metrics(pred, ref, base, cluster, rng, CALIBRATION_RESAMPLES, block)
            ceiling = value_ceiling(_returns_matrix(p["v_returns"]), base, rng, block=block)
            best = {"pearson": ceiling.pearson, "sign_accuracy": ceiling.sign_accuracy,
                    "spread": ceiling.spread}  # fmt: skip
            for name in VALUE_METRICS:
                iv = got[name]
                rows.append([*head, phase, name, len(p), iv.point, iv.low, iv.high,
                             best.get(name, np.nan), ceiling.reliability])  # fmt: skip
    cols = [*by(frame), "phase", "metric", "states", "value", "ci_low", "ci_high", "ceiling",
            "reliability"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def value_reliability(estimates: pd.DataFrame, bins: int = RELIABILITY_BINS) -> pd.DataFrame:
    """Per method, env and bin of V_target (equal width over its range): the mean prediction and
    the mean independent reference V^MC, and the states (the reliability curve)."""
    frame = estimates.dropna(subset=["value"])
    lo, hi = frame["value"].min(), frame["value"].max()
    width = (hi - lo) / bins if hi > lo else 1.0
    binned = frame.assign(bin=np.minimum(((frame["value"] - lo) / width).astype(int), bins - 1))
    return (
        binned.groupby([*by(binned), "bin"])
        .agg(prediction=("value", "mean"), target=("v", "mean"), states=("value", "size"))
        .reset_index()
    )
