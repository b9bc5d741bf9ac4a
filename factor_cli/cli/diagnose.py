"""``factor diagnose KIND RUN_OR_STUDY...``: the paper's mechanism evidence for recorded runs.

Thin layer: read the runs' records from the ledger (:mod:`factor_cli.ledger.records`), compute
the kind's tables (:mod:`factor_cli.stats.diagnose`), print them, and write ``<kind>.csv`` and
``<kind>.png`` under ``--out``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import console, fail, first_line
from .ledger import ExperimentOpt, TrackingOpt


@dataclass(frozen=True)
class Kind:
    summary: str
    tables: Callable[[Any], dict[str, Any]]
    """Records -> named tables; the first is written as ``<kind>.csv``; those whose name starts
    with ``_`` are data for the plot and the JSON, not printed."""
    plot: Callable[[Any, dict[str, Any], Path], Path]
    """(records, tables, png path) -> the PNG written."""


def _single(name: str, table: Callable[[Any], Any], plot: Callable[[Any, Path], Path]) -> Kind:
    """A kind of one table computed from the action records, plotted from that table."""
    return Kind(
        KIND_SUMMARIES[name],
        lambda r: {name: table(r.actions)},
        lambda r, t, out: plot(t[name], out),
    )


@dataclass(frozen=True)
class McOptions:
    """The replaying kinds' options: the plan (samples, actions, seed) and the folder whose
    sub-folders cache their estimates."""

    samples: int
    actions: int
    seed: int
    out: Path
    replace: str = "vocab"
    to_end: bool = False


def _replaying(
    mc: McOptions,
    name: str,
    estimates: str,
    table: Callable[[Any, Any], dict[str, Any]],
    plot: Callable[[dict[str, Any], Path], Path],
    folder: str,
    samples: int | None = None,
) -> Kind:
    """A kind that replays kept checkpoints: ``estimates`` (``module:function`` of
    :mod:`factor_cli.diagnostics`, imported when run) under a progress bar, its rows cached in
    ``--out/folder``, then the tables ``table(rows, records)`` (the rows kept as ``_rows`` for
    the plot)."""

    def tables(r: Any) -> dict[str, Any]:
        import importlib

        from rich.progress import Progress

        from factor_cli.diagnostics.replay import McPlan

        module, fn = estimates.split(":")
        estimate = getattr(importlib.import_module(f"factor_cli.diagnostics.{module}"), fn)
        replace = mc.replace if name == "token-perturb" else "vocab"  # others draw no tokens
        to_end = mc.to_end and name in ("td-sign", "value")  # the others keep the run's
        plan = McPlan(samples=samples or mc.samples, actions=mc.actions, seed=mc.seed,
                      replace=replace, to_end=to_end)  # fmt: skip
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task(name, total=None)

            def progress(label: str, done: int, total: int) -> None:
                bar.update(task, description=label, completed=done, total=total)

            rows = estimate(r.actions, r.runs, plan, mc.out / folder, progress)
        return {**table(rows, r), "_rows": rows}

    return Kind(KIND_SUMMARIES[name], tables, lambda r, t, out: plot(t, out))


def _replaying_kinds(mc: McOptions) -> dict[str, Kind]:
    from factor_cli.stats import diagnose as d
    from factor_cli.stats import diagnose_plots as p

    td = "td_sign:td_sign_estimates"  # one replay (and cache) serves td-sign and value
    return {
        "td-sign": _replaying(
            mc, "td-sign", td, lambda rows, r: {"td-sign": d.td_sign(rows, seed=mc.seed)},
            lambda t, out: p.td_sign_plot(t["_rows"], out), "td-sign-estimates",
        ),
        "value": _replaying(
            mc, "value", "td_sign:value_estimates",
            lambda rows, r: {
                "value": d.value_against_mc(rows, r.actions, seed=mc.seed),
                "reliability": d.value_reliability(rows),
                "against its training targets": d.value_calibration(r.actions,
                                                                    r.continuations)[0],
            },
            lambda t, out: p.value_plot(t["reliability"], out), "td-sign-estimates",
        ),
        "feedback": _replaying(
            mc, "feedback", "feedback_probe:feedback_estimates",
            lambda rows, r: {"feedback": d.feedback_concentration(rows),
                             "true against the others (paired, top-quartile mass)":
                                 d.feedback_contrasts(rows, seed=mc.seed),
                             "teacher gap of the start model (before RL)": _start_gap(r, mc)},
            lambda t, out: p.feedback_plot(t["feedback"], out), "feedback", samples=1,
        ),
        "token-perturb": _replaying(
            mc, "token-perturb", "token_perturb:perturb_estimates",
            lambda rows, r: {"token-perturb": d.token_perturb(rows, seed=mc.seed)},
            lambda t, out: p.token_perturb_plot(t["token-perturb"], out), "token-perturb",
        ),
    }  # fmt: skip


def _start_gap(r: Any, mc: McOptions) -> Any:
    """``factor model teacher-gap``'s table for the start model of each run with a teacher."""
    from factor_cli.credit import METHODS
    from factor_cli.diagnostics.teacher_gap import GapPlan, start_gap_estimates
    from factor_cli.stats.diagnose import teacher_gap

    runs = r.runs[r.runs["method"].map(lambda m: METHODS.get(m).uses_teacher)]
    with console.status("teacher gap of the start models"):
        rows = start_gap_estimates(runs, GapPlan(seed=mc.seed), mc.out / "feedback")
    return teacher_gap(rows, seed=mc.seed)


def _compare() -> Kind:
    from factor_cli.stats import diagnose as d
    from factor_cli.stats import diagnose_plots as p

    def tables(r: Any) -> dict[str, Any]:
        from factor_cli.rollout.credit_replay import COMPARED, replay_credit

        replayed = replay_credit(r.actions, COMPARED)
        return {"compare": d.credit_agreement(replayed, list(COMPARED)), "_credit": replayed}

    def plot(r: Any, t: dict[str, Any], out: Path) -> Path:
        return p.agreement_plot(t["compare"], out)

    return Kind(KIND_SUMMARIES["compare"], tables, plot)


def _kinds(mc: McOptions) -> dict[str, Kind]:
    from factor_cli.stats import diagnose as d
    from factor_cli.stats import diagnose_plots as p

    return {
        "coef-deviation": Kind(
            KIND_SUMMARIES["coef-deviation"],
            lambda r: {
                "coef-deviation": d.coef_deviation(r.actions),
                "coef-deviation by seed": d.coef_deviation(r.actions, per_seed=True),
            },
            lambda r, t, out: p.coef_deviation_plot(d.credited(d.active_steps(r.actions)), out),
        ),
        "groups": _single("groups", d.group_signal, p.group_signal_plot),
        "length-bias": _single("length-bias", d.length_bias, p.length_bias_plot),
        "horizon": Kind(
            KIND_SUMMARIES["horizon"],
            lambda r: {
                "horizon": (h := d.horizon(r.actions)),
                "method differences": d.horizon_differences(h),
            },
            lambda r, t, out: p.horizon_plot(t["horizon"], out),
        ),
        "position": _single(
            "position", lambda a: d.credit_by_position(a, seed=mc.seed), p.position_plot
        ),
        "compare": _compare(),
        **_replaying_kinds(mc),
    }


KIND_SUMMARIES = {
    "coef-deviation": "|mean multiplier - 1| per action: median, share over 10% (Fig. 5A)",
    "groups": "per step, groups with any non-zero A^seq and zero-credit actions",
    "value": "V_target against an independent N-continuation return, with ceiling (Table 17)",
    "length-bias": "surrogate weight by action length, token- vs action-mean (Table 24)",
    "horizon": "success, and each method difference, by trajectory length (Table 26)",
    "position": "mean credit share A*_t / A^seq by turn, in wins and in losses, with CIs",
    "td-sign": "sign of the credit against independent Monte-Carlo advantages (Fig. 5B)",
    "compare": "every estimator's credit on the same recorded actions: sign agreement, rank r",
    "feedback": "allocation concentration with true, shuffled and no feedback (Table 27)",
    "token-perturb": "return change from perturbing top vs bottom allocation tokens (Fig. 5C)",
}


def _steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        first, last = int(lo) if lo else 1, int(hi) if hi else 10**9
    except ValueError:
        fail(f"--steps {text!r}: expected A:B (e.g. 5:12, 5: or :12)")
    if not sep or first < 1 or last < first:
        fail(f"--steps {text!r}: expected A:B with 1 <= A <= B (e.g. 5:12, 5: or :12)")
    return first, last


def _print(name: str, table: Any) -> None:
    out = Table(title=name, title_justify="left")
    for col in table.columns:
        out.add_column(str(col), justify="left" if table[col].dtype == object else "right")
    for row in table.itertuples(index=False):
        out.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    console.print(out)


def diagnose_cmd(
    kind: Annotated[str, typer.Argument(help="What to compute: " + ", ".join(KIND_SUMMARIES))],
    targets: Annotated[
        list[str], typer.Argument(help="Ledger run ids (unique prefixes) or study names.")
    ],
    steps: Annotated[
        str | None,
        typer.Option("--steps", help="Training steps A:B (inclusive; A: or :B open-ended)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Folder for KIND.csv and KIND.png.")] = Path(
        "diagnostics"
    ),
    samples: Annotated[
        int,
        typer.Option(
            "--samples",
            min=1,
            help="td-sign, value, token-perturb: continuations per side (value: >= 2).",
        ),
    ] = 16,
    actions: Annotated[
        int,
        typer.Option(
            "--actions",
            min=1,
            help="td-sign, value, feedback, token-perturb: actions drawn per kept step.",
        ),
    ] = 32,
    mc_seed: Annotated[
        int,
        typer.Option("--mc-seed", help="replaying kinds: seed of the draws; position: of the CIs."),
    ] = 0,
    replace: Annotated[
        str,
        typer.Option(
            "--replace",
            help="token-perturb: replacement tokens from the whole vocabulary (vocab) or from "
            "the state's admissible actions (admissible: a perturbed action can stay valid).",
        ),
    ] = "vocab",
    to_end: Annotated[
        bool,
        typer.Option(
            "--to-end",
            help="td-sign, value: continuations play until the episode ends, not for the "
            "run's continuations.horizon turns (a reference the training's horizon choice "
            "does not shape).",
        ),
    ] = False,
    tracking_uri: TrackingOpt = None,
    experiment: ExperimentOpt = "factor",
) -> None:
    """The paper's mechanism diagnostics, computed from the per-action records every training
    run writes (`transcripts.records`), pooled over the runs given (a study: all its training
    runs), grouped by method and environment.

    Kinds:

    - **coef-deviation**: |mean multiplier - 1| per action over the teacher-active steps (paper
      Fig. 5A, Table 18): FACTOR's is 0 to float precision, SERL's is not.
    - **groups**: the share of groups whose outcome gives any signal, and of zero-credit
      actions, per step.
    - **value**: V_target(x_t) of the states the td-sign replay draws, against an independent
      Monte-Carlo return from x_t (the mean of --samples continuations, never trained on):
      MSE, MAE, bias, Pearson r and sign accuracy of V - b (b the group baseline), early and
      late, with bootstrap CIs over trajectories and the reference's noise ceiling (Table 17).
      It shares td-sign's replay and cache; also prints V against its own training targets.
    - **length-bias**: mean surrogate weight by action length under both reductions (Table 24).
    - **horizon**: training success by trajectory length, and the difference of each pair of
      methods per bucket (Table 26).
    - **position**: the mean credit share A*_t / A^seq and the mean A*_t by turn (0-based; turns
      from 10 on pooled, and the last action apart), for successful and failed trajectories,
      with 95% bootstrap intervals over trajectories (--mc-seed seeds them): does credit flow
      where the outcome says?
    - **td-sign**: for up to --actions actions of each step whose policy was kept (train with
      checkpoint_keep_every=N; step k replays checkpoint k - 1), --samples continuations from
      x_t and from x_{t+1} give an independent Monte-Carlo advantage; the table is the share
      whose sign the credit matches, early and late in the run (Fig. 5B, Table 19), beside
      the best agreement a perfect credit could reach against that noisy reference (ceiling).
      Estimates are cached under --out, so an interrupted run resumes.
    - **compare**: each run's recorded actions replayed through the estimators of GRPO and
      SERL-Repro (broadcast A^seq), GiGPO, HGPO, FACTOR (TD) and GAE(0.95): pairwise sign
      agreement and Spearman correlation of their credit, per method of the runs. Anchor
      states are keyed by the action history (docs/diagnostics.md).
    - **feedback**: the trajectories of up to --actions drawn actions of each kept step are
      replayed under the kept policy, and the teacher scores their replies with the true
      feedback, another action's, and none; the table is the allocation's concentration
      under each (Table 27), then the paired drop from true to the others with intervals,
      and the teacher-student gap of each run's start model (`factor model teacher-gap`).
      Cached under --out/feedback.
    - **token-perturb**: for the same drawn actions, the top and the bottom quarter of each
      action's tokens by allocation are replaced by random tokens (--replace admissible: drawn
      from the tokens of the state's admissible actions, so a perturbed action can stay
      valid), and --samples continuations after each perturbed action and after the recorded
      one give the return change, by credit sign, with the share of valid perturbations, the
      AUC and the top-bottom effect (Fig. 5C, Tables 15-16). Cached under --out/token-perturb.
    """
    if replace not in ("vocab", "admissible"):
        fail(f"--replace {replace!r}: expected vocab or admissible")
    kinds = _kinds(McOptions(samples, actions, mc_seed, out, replace, to_end))
    if kind not in kinds:
        fail(f"unknown diagnostic {kind!r}; available: {', '.join(kinds)}")
    window = _steps(steps)
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a folder")
    from factor_cli.ledger import LedgerError
    from factor_cli.ledger.records import load_records

    try:
        records = load_records(targets, window, tracking_uri, experiment)
        tables = kinds[kind].tables(records)
    except (LedgerError, ValueError, FileNotFoundError) as exc:
        fail(f"diagnose {kind}: {first_line(exc)}")
    out.mkdir(parents=True, exist_ok=True)
    first = next(iter(tables.values()))
    first.to_csv(out / f"{kind}.csv", index=False)
    png = kinds[kind].plot(records, tables, out / f"{kind}.png")
    if as_json:
        payload = {name: json.loads(t.to_json(orient="records")) for name, t in tables.items()}
        console.print_json(json.dumps(payload))
        return
    for name, table in tables.items():
        if not name.startswith("_"):
            _print(name, table)
    console.print(f"{len(records.runs)} run(s); wrote {out / f'{kind}.csv'} and {png}",
                  highlight=False)  # fmt: skip
