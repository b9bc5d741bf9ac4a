"""How well can a value estimate rank states at CPU scale, and which lever gets it there?

    .venv/bin/python benchmarks/value_fit.py collect [--seed 42] [--steps 8] [--k 16]
        [--set a.b=c ...] [--tag NAME]
    .venv/bin/python benchmarks/value_fit.py fit [--seed 42] [--tag NAME] [--skip-encoders] [--json]
    .venv/bin/python benchmarks/value_fit.py td [--seed 42] [--tag NAME]
    .venv/bin/python benchmarks/value_fit.py stale [--seed 42] [--tag NAME] [--steps 12]

``collect`` builds one fixed data set on the smoke task (coin, six rooms, 12 turns) from the
smoke preset's warm-started policy (seed ``--seed``): ``--steps`` rollouts of the preset's
size (4 groups x 4 trajectories, T = 1), and from every root state x_t (t = 0..T_i - 1) ``--k``
continuations at the continuations' temperature, each played to the end of the episode's
turn limit (12 - t more turns). Each continuation keeps its outcome G and its length, so a
target truncated at the preset's continuation horizon (6 turns) is read off the same plays. Per
state it stores the policy's hidden state at the boundary token (the last prompt token of
action t) at every layer, and the prompt's token ids. The set is written once to
``benchmarks/results/value_fit/data-s{seed}.pt`` (atomic; a rerun reuses it). ``--set`` changes
the preset for another data set (``--set model.init_tiny=5m --set model.path=runs/tiny-5m``: a
larger backbone), which ``--tag`` names (``data-s{seed}-{tag}.pt``, ``fit-s{seed}-{tag}.json``).

``fit`` reads the boundary states in float32 under the data set's warm start (the stored float16
copy checks that warm start; ``value_fit_variants._boundary``), splits the states by trajectory
into fit (3/4) and held-out (1/4) trajectories, fits value estimators under variants on the fit
states' single-continuation targets, and measures each on the held-out states against their
K-continuation mean (the reference, never used for fitting): Pearson r, sign accuracy of V - b
against V^MC - b (b the mean outcome of the state's group's roots, as `factor diagnose value`
takes it: about the sign of TAC's credit up to x_t, whose baseline is the others' mean), mean
bias, and fit seconds; beside them the reference's noise ceiling
(``factor_cli.stats.calibration``). Results print as a table and go to
``benchmarks/results/value_fit/fit-s{seed}.json``; docs/benchmarks.md ("Value fitting") has the
committed table.

``td`` scores TD credit's sign from each value estimate against an independent Monte-Carlo
advantage on the data set's actions (``value_fit_td``): the fixed-data counterpart of
`factor diagnose td-sign`, and what a value would need to reach a given agreement.

``stale`` trains the smoke preset from the data set's warm start and measures what a head loses
when the features its targets were stored with were computed under older weights, against
features recomputed under the current ones (``value_fit_stale``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results" / "value_fit"


def _smoke(seed: int, extra: list[str]) -> Any:
    from factor_cli.train.config import load_config

    # GRPO's rollout: the roots alone (the continuations are played here, for every state).
    return load_config("smoke", [f"seed={seed}", "method=grpo", *extra])


def _roots(trainer: Any, steps: int) -> list[Any]:
    """The root episodes of ``steps`` rollouts, in order; group ids made unique per step."""
    roots = []
    for k in range(1, steps + 1):
        rollout = trainer.phase_rollout(k)
        for ep in rollout.roots:
            ep.start.group = k * 1000 + ep.start.group
            roots.append(ep)
        print(f"[collect] rollout {k}/{steps}: {len(rollout.roots)} roots", file=sys.stderr)
    return roots


def _continuations(trainer: Any, roots: list[Any], k: int, seed: int) -> tuple[list, list]:
    """(states, plays): every root state (root index, t) and its ``k`` continuations' (G, turns)."""
    from factor_cli.envs.pool import EnvPool
    from factor_cli.rollout.continuations import TEMPERATURE, outcome_of
    from factor_cli.rollout.runner import Job, RolloutRunner, Start

    cfg, max_turns = trainer.cfg, trainer.max_turns
    states = [(i, t) for i, ep in enumerate(roots) for t in range(len(ep.turns))]
    jobs = []
    for s, (i, t) in enumerate(states):
        ep = roots[i]
        start = Start(ep.start.instance_id, ep.start.group, ep.actions[:t],
                      ep.observations[: t + 1], max_turns - t)  # fmt: skip
        jobs += [Job(start, s * k + n, seed, TEMPERATURE, scored=False) for n in range(k)]
    with EnvPool(cfg.env.name, 64, **cfg.env.options) as pool:
        runner = RolloutRunner(pool, trainer.backend, trainer.fmt, max_turns,
                               constrain=cfg.rollout.valid_action_decoding)  # fmt: skip
        t0 = time.perf_counter()

        def progress(done: int, total: int) -> None:
            if done % 2000 == 0:
                rate = done / max(time.perf_counter() - t0, 1e-9)
                print(f"[collect] continuation turns {done}/{total} ({rate:.0f}/s)",
                      file=sys.stderr)  # fmt: skip

        episodes, _ = runner.play(jobs, on_turn=progress)
    plays = [[(outcome_of(e), len(e.turns), e.start_failed)
              for e in episodes[s * k : (s + 1) * k]] for s in range(len(states))]  # fmt: skip
    return states, plays


@torch.no_grad()
def _features(model: Any, prompts: list[list[int]], batch: int = 32) -> torch.Tensor:
    """The hidden state at each prompt's last token at every layer, [N, L + 1, H] float32
    (layer 0 the embeddings, layer L the last, after the final norm as the value head reads)."""
    out = []
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo : lo + batch]
        width = max(map(len, chunk))
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for r, p in enumerate(chunk):
            ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        last = torch.tensor([len(p) - 1 for p in chunk])
        rows = torch.arange(len(chunk))
        out.append(torch.stack([h[rows, last] for h in hidden], dim=1).float())
    return torch.cat(out)


def _stem(seed: int, tag: str) -> str:
    return f"s{seed}-{tag}" if tag else f"s{seed}"


def collect(seed: int, steps: int, k: int, extra: list[str], tag: str = "") -> Path:
    from factor_cli.atomic import atomic_target
    from factor_cli.rollout.continuations import outcome_of
    from factor_cli.train.run import warm_start
    from factor_cli.train.trainer import Trainer, ensure_model

    path = RESULTS / f"data-{_stem(seed, tag)}.pt"
    if path.exists():
        print(f"[collect] reusing {path}", file=sys.stderr)
        return path
    cfg = _smoke(seed, extra)
    ensure_model(cfg)
    model_path = warm_start(cfg, lambda *a: None, lambda m: print(m, file=sys.stderr))
    trainer = Trainer(cfg, model_path)
    try:
        t0 = time.perf_counter()
        roots = _roots(trainer, steps)
        t_roots = time.perf_counter() - t0
        states, plays = _continuations(trainer, roots, k, seed + 7919)
        t_cont = time.perf_counter() - t0 - t_roots
        model = trainer.policy.model
        model.eval()
        prompts = [roots[i].turns[t].prompt_ids for i, t in states]
        feats = _features(getattr(model, "model", model), prompts)
    finally:
        trainer.close()
    data = {
        "seed": seed, "overrides": list(extra), "k": k, "max_turns": trainer.max_turns,
        "horizon": cfg.continuations.horizon,
        "features": feats.half(),  # [N, L + 1, H]; float16 keeps the committed file small
        "outcome": torch.tensor([[g for g, _, _ in p] for p in plays]),  # [N, K]
        "length": torch.tensor([[n for _, n, _ in p] for p in plays]),  # [N, K]
        "failed": torch.tensor([[f for _, _, f in p] for p in plays]),  # [N, K]
        "turn": torch.tensor([t for _, t in states]),
        "traj": torch.tensor([i for i, _ in states]),
        "group": torch.tensor([roots[i].start.group for i, _ in states]),
        "root_outcome": torch.tensor([outcome_of(ep) for ep in roots]),
        "root_group": torch.tensor([ep.start.group for ep in roots]),
        "prompts": [list(map(int, p)) for p in prompts],  # x_t's token ids
        "model_path": str(Path(model_path).resolve()),  # the warm start the policy loaded
        "seconds": {"roots": t_roots, "continuations": t_cont},
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    with atomic_target(path) as tmp:
        torch.save(data, tmp)
    print(f"[collect] {len(states)} states x {k} continuations in {t_cont:.0f} s "
          f"(roots {t_roots:.0f} s) -> {path}", file=sys.stderr)  # fmt: skip
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="build the data set (once per seed)")
    c.add_argument("--seed", type=int, default=42)
    c.add_argument("--steps", type=int, default=8, help="rollouts of 16 roots")
    c.add_argument("--k", type=int, default=16, help="continuations per state")
    c.add_argument("--set", action="append", default=[], help="config override a.b=c")
    c.add_argument("--tag", default="", help="names a data set collected with --set")
    f = sub.add_parser("fit", help="fit the variants and print the table")
    f.add_argument("--seed", type=int, default=42)
    f.add_argument("--tag", default="", help="the data set's --tag")
    f.add_argument("--skip-encoders", action="store_true",
                   help="leave out the separate-encoder variants (minutes each)")  # fmt: skip
    f.add_argument("--draws", type=int, default=1,
                   help="refit on this many target draws; adds r's mean ± sd")  # fmt: skip
    f.add_argument("--json", action="store_true")
    d = sub.add_parser(
        "td",
        help="TD credit's sign from each value estimate (value_fit_td)",
        description="Score TD credit's sign from each value estimate (means of k fresh "
        "continuations, the cross-fitted learned heads) against an independent half of the "
        "continuations, with the ceiling and a model-free bound on it, and the credit share by "
        "turn in wins; writes td-s{seed}[-{tag}].json beside the data set.",
    )
    d.add_argument("--seed", type=int, default=42, help="the data set's --seed")
    d.add_argument("--tag", default="", help="the data set's --tag")
    s = sub.add_parser(
        "stale",
        help="stale against recomputed features (value_fit_stale)",
        description="Train the smoke preset from the data set's warm start, read the data "
        "set's states again under the weights after every step, and score heads (the preset's "
        "MLP, ridge on either feature) fitted on step 0's features (stale), on a replay "
        "buffer's mix of the last ten steps' (as the trainer holds them) and on the current "
        "step's (recomputed), the targets fixed; writes stale-s{seed}[-{tag}].json beside the "
        "data set (the features go to stale-features-*.pt, reused on a rerun). About 13 "
        "minutes.",
    )
    s.add_argument("--seed", type=int, default=42, help="the data set's --seed")
    s.add_argument("--tag", default="", help="the data set's --tag")
    s.add_argument("--steps", type=int, default=12, help="training steps (the smoke run's 12)")
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        if args.set and not args.tag:
            ap.error("--set makes another data set: name it with --tag")
        collect(args.seed, args.steps, args.k, args.set, args.tag)
        return 0
    if args.cmd == "td":
        return _td(ap, args.seed, args.tag)
    if args.cmd == "stale":
        return _stale(ap, args.seed, args.tag, args.steps)
    if args.draws < 1:
        ap.error(f"--draws {args.draws}: give 1 (one fit per variant) or more")
    from value_fit_variants import run_fit  # torch-heavy: only for fit

    data = RESULTS / f"data-{_stem(args.seed, args.tag)}.pt"
    if not data.exists():
        ap.error(f"{data} is missing: run collect with the same --seed and --tag first")
    rows = run_fit(data, encoders=not args.skip_encoders, draws=args.draws)
    out = RESULTS / f"fit-{_stem(args.seed, args.tag)}.json"
    _write_json(out, rows)
    print(json.dumps(rows, indent=1) if args.json else _table(rows))
    return 0


def _td(ap: argparse.ArgumentParser, seed: int, tag: str) -> int:
    from value_fit_td import positions, run_td  # torch-heavy: only for td

    data = RESULTS / f"data-{_stem(seed, tag)}.pt"
    if not data.exists():
        ap.error(f"{data} is missing: run collect with the same --seed and --tag first")
    loaded = torch.load(data, weights_only=False)
    rows = run_td(loaded)
    shares = positions(loaded)
    out = {"td_sign": rows, "win_shares_mc16": shares}
    _write_json(RESULTS / f"td-{_stem(seed, tag)}.json", out)
    print(_table(rows))
    print("\ncredit share by turn in wins, TD credit from the 16-continuation means:")
    print(_table(shares))
    return 0


def _stale(ap: argparse.ArgumentParser, seed: int, tag: str, steps: int) -> int:
    from value_fit_stale import run_stale, train_and_read  # torch-heavy: only for stale

    if steps < 1:
        ap.error(f"--steps {steps}: give at least 1 training step")
    data = RESULTS / f"data-{_stem(seed, tag)}.pt"
    if not data.exists():
        ap.error(f"{data} is missing: run collect with the same --seed and --tag first")
    loaded = torch.load(data, weights_only=False)
    feats = train_and_read(loaded, steps, RESULTS / f"stale-features-{_stem(seed, tag)}-{steps}.pt")
    rows = run_stale(loaded, feats)
    _write_json(RESULTS / f"stale-{_stem(seed, tag)}.json", rows)
    print(_table(rows))
    return 0


def _write_json(path: Path, obj: Any) -> None:
    """Whole or not at all: two runs at once, or a Ctrl-C, never leave half a result."""
    from factor_cli.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def _table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    for r in rows:
        lines.append(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
