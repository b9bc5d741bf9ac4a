"""What a run shows of itself, on one real tiny run (resumed once): transcripts of every step
and evaluation, `factor ledger show` (terminal, HTML in headless Chromium, bad input, a torn
line), the starting vs final policy on the same items with a paired CI, and the progress plot.

The run trains 2 steps with an evaluation after every step and checkpoints only at step 2. It
is stopped after step 1 (no checkpoint yet: as a crash just after step 1's transcript was
written) and resumed, so step 1 is played again: its transcript must not be duplicated, and the
starting policy, evaluated in the first session, must not be evaluated again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest
from browser import chromium_tab
from test_train import needs_twx, tiny_overrides
from typer.testing import CliRunner

from factor_cli.cli.main import app
from factor_cli.ledger.transcripts import EpisodeRecord, parse_jsonl
from factor_cli.train.config import TrainConfig, load_config
from factor_cli.train.evaluate import metric
from factor_cli.train.run import RunSummary

if TYPE_CHECKING:
    from click.testing import Result
    from mlflow.tracking import MlflowClient

pytestmark = needs_twx
runner = CliRunner()
PER_STEP = 3  # more than the 2 root episodes of a step: all of them are written


@dataclass
class TinyRun:
    cfg: TrainConfig
    summary: RunSummary
    first: RunSummary
    logs: list[str]

    @property
    def uri(self) -> str:
        return str(self.cfg.tracking_uri)

    def transcript(self, name: str) -> list[EpisodeRecord]:
        episodes, torn = parse_jsonl(
            (self.summary.run_dir / "transcripts" / name).read_text(), name
        )
        assert not torn
        return episodes


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    from factor_cli.train.run import train

    tmp = tmp_path_factory.mktemp("transcripts")
    overrides = [
        *tiny_overrides(tiny_model_dir, tmp, "factor", steps=2),
        "eval.every=1",
        f"transcripts.episodes_per_step={PER_STEP}",
        "checkpoint_every=2",
    ]
    cfg = load_config("smoke", overrides)
    logs: list[str] = []
    first = train(cfg, lambda *a: None, logs.append, stop_after=1)
    assert first.steps == 1 and not (first.run_dir / "checkpoints" / "latest").exists()
    summary = train(cfg, lambda *a: None, logs.append, resume_run_id=first.run_id)
    return TinyRun(cfg, summary, first, logs)


def _client(run: TinyRun) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(run.uri)


def _show(run: TinyRun, *args: str) -> Result:
    return runner.invoke(
        app, ["ledger", "show", run.summary.run_id[:8], "--tracking-uri", run.uri, *args]
    )


def _flat(text: str) -> str:
    """Terminal output without table rules and line wrapping: words with single spaces."""
    return " ".join(re.sub(r"[│┃║]", " ", text).split())


# ----------------------------------------------------------------------------- the run folder


def test_run_writes_transcripts_items_and_plot_locally_and_as_artifacts(tiny_run: TinyRun) -> None:
    run_dir = tiny_run.summary.run_dir
    names = sorted(p.name for p in (run_dir / "transcripts").iterdir())
    evals = [f"eval-{k:06d}.jsonl" for k in (0, 1, 2)]
    assert names == [*evals, "step-000001.jsonl", "step-000002.jsonl"]
    assert (run_dir / "progress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert tiny_run.summary.progress_path == run_dir / "progress.png"
    client = _client(tiny_run)
    rid = tiny_run.summary.run_id
    logged = {f.path for f in client.list_artifacts(rid, "transcripts")}
    assert logged == {f"transcripts/{n}" for n in names}
    assert "progress.png" in {f.path for f in client.list_artifacts(rid)}
    items = {f.path for f in client.list_artifacts(rid, "items")}
    assert {"items/eval_items.csv", "items/eval_items_start.csv"} <= items


def test_step_transcripts_hold_each_action_s_credit_value_and_token_weights(
    tiny_run: TinyRun,
) -> None:
    for k in (1, 2):
        episodes = tiny_run.transcript(f"step-{k:06d}.jsonl")
        assert [e.episode for e in episodes] == [0, 1]  # 2 roots (1 group x 2), no more
        assert [e.trajectory for e in episodes] == [0, 1]  # first of the group, then second
        for ep in episodes:
            assert (ep.kind, ep.step, ep.category) == ("step", k, None)
            assert ep.instance.startswith("coin") and ep.turns
            # FACTOR's TAC credit telescopes: sum_t A*_t = A^seq (5 decimals kept).
            assert ep.credit_sum == pytest.approx(ep.a_seq, abs=1e-4)
            for t, turn in enumerate(ep.turns):
                assert turn.t == t and turn.credit is not None and turn.value is not None
                assert "".join(turn.tokens) == turn.reply
                assert len(turn.tokens) == len(turn.action_mask) == len(turn.weights)
                assert [w is not None for w in turn.weights] == turn.action_mask
                assert turn.mean_weight == pytest.approx(1.0, abs=1e-4)  # APM: mean_j omega = 1
                assert turn.observation.strip()[:40] in turn.prompt and turn.feedback


def test_eval_transcripts_hold_every_eval_episode_without_credit(tiny_run: TinyRun) -> None:
    final = pd.read_csv(tiny_run.summary.items_path, dtype={"item_id": str})
    for k in (0, 1, 2):
        episodes = tiny_run.transcript(f"eval-{k:06d}.jsonl")
        assert len(episodes) == 2 == len(final)  # eval.max_items
        assert [e.instance for e in episodes] == final["item_id"].tolist()
        for ep in episodes:
            assert ep.kind == "eval" and ep.step == k and ep.category is not None
            assert ep.a_seq is None and all(t.credit is None for t in ep.turns)
            assert all(w is None for t in ep.turns for w in t.weights)


# ----------------------------------------------------------------------------- resume, eval


def test_resume_neither_duplicates_steps_nor_evaluates_the_start_again(tiny_run: TinyRun) -> None:
    # Step 1 was played twice (no checkpoint before the resume); its transcript holds it once.
    assert len(tiny_run.transcript("step-000001.jsonl")) == 2
    client = _client(tiny_run)
    history = client.get_metric_history(tiny_run.summary.run_id, "eval_metric_start")
    assert [(m.step, m.value) for m in history] == [(0, tiny_run.summary.comparison.start)]
    assert sum("starting policy: evaluated before" in m for m in tiny_run.logs) == 1
    assert tiny_run.first.run_id == tiny_run.summary.run_id


def test_start_and_final_evaluations_on_the_same_items_with_a_paired_ci(tiny_run: TinyRun) -> None:
    s = tiny_run.summary
    start = pd.read_csv(s.run_dir / "eval_items_start.csv", dtype={"item_id": str})
    final = pd.read_csv(s.items_path, dtype={"item_id": str})
    assert start["item_id"].tolist() == final["item_id"].tolist()
    cmp = s.comparison
    assert cmp is not None and cmp.items == len(final)
    assert (cmp.start, cmp.final) == (metric(start), metric(final))
    assert cmp.final == s.eval_metric and cmp.delta == pytest.approx(cmp.final - cmp.start)
    assert cmp.ci_low <= cmp.delta <= cmp.ci_high
    logged = _client(tiny_run).get_run(s.run_id).data.metrics
    assert logged["eval_metric_start"] == cmp.start and logged["eval_metric"] == cmp.final
    assert logged["eval_metric_delta"] == pytest.approx(cmp.delta)
    assert (logged["eval_metric_delta_ci_low"], logged["eval_metric_delta_ci_high"]) == (
        pytest.approx(cmp.ci_low),
        pytest.approx(cmp.ci_high),
    )
    evals = [json.loads(x) for x in (s.run_dir / "evals.jsonl").read_text().splitlines()]
    assert sorted({e["step"] for e in evals}) == [0, 1, 2]  # the plotted points


def test_factor_train_prints_start_final_and_the_ci(
    tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    import factor_cli.train.run as run_module

    monkeypatch.setattr(run_module, "train", lambda *a, **k: tiny_run.summary)
    out = runner.invoke(app, ["train", "--set", "steps=2"])
    assert out.exit_code == 0, out.output
    cmp = tiny_run.summary.comparison
    text = _flat(out.output)
    assert f"eval macro success, start {cmp.start:.4f}" in text
    assert f"eval macro success, final {cmp.final:.4f}" in text
    assert f"{cmp.start:.4f} -> {cmp.final:.4f} on the same 2 items" in text
    assert f"95% CI [{cmp.ci_low:+.4f}, {cmp.ci_high:+.4f}]" in text
    assert "paired bootstrap" in text and "progress.png" in text


# ----------------------------------------------------------------------------- ledger show


def test_show_prints_an_episode_with_its_credit(tiny_run: TinyRun) -> None:
    out = _show(tiny_run)
    assert out.exit_code == 0, out.output
    ep = tiny_run.transcript("step-000002.jsonl")[0]
    text = _flat(out.output)
    assert "training step 2, episode #0 of 2" in text and ep.instance in text
    assert f"A^seq = {ep.a_seq:+.4f}" in text and "Σ_t A*_t" in text and "= A^seq ✓" in text
    assert f"{ep.turns[0].credit:+.4f}" in text and "↳" in text
    assert "recorded: steps 1-2; evals after steps 0-2" in text
    second = _show(tiny_run, "--step", "1", "--episode", "1", "--prompt")
    assert second.exit_code == 0 and "training step 1, episode #1 of 2" in second.output
    assert "x_t:" in second.output
    start = _show(tiny_run, "--eval", "--step", "0")
    assert start.exit_code == 0 and "eval of the starting policy, episode #0" in start.output
    assert "category" in start.output and "A^seq =" not in start.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["zz"], "not a ledger run id"),
        (["f" * 32], "no such run"),
        (["0123abcd"], "no run id starts with it"),
        (["RUN", "--step", "9"], "training steps recorded: 1-2"),
        (["RUN", "--eval", "--step", "7"], "evaluations recorded: 0-2"),
        (["RUN", "--episode", "5"], "recorded episodes 0-1"),
        (["RUN", "--step", "-1"], "steps are 0 or more"),
    ],
)
def test_show_bad_input_is_one_line(tiny_run: TinyRun, args: list[str], needle: str) -> None:
    args = [tiny_run.summary.run_id[:8] if a == "RUN" else a for a in args]
    out = runner.invoke(app, ["ledger", "show", *args, "--tracking-uri", tiny_run.uri])
    err = out.stderr.strip()
    assert out.exit_code == 1 and err.startswith("error: ") and "\n" not in err, out.output
    assert needle in err and "Traceback" not in out.output


def test_show_skips_and_flags_a_torn_last_line(tiny_run: TinyRun) -> None:
    """A transcript copied mid-write ends in half a line: the episodes before it still show."""
    art = _client(tiny_run).get_run(tiny_run.summary.run_id).info.artifact_uri
    folder = Path(unquote(urlparse(art).path)) / "transcripts"
    torn = folder / "step-000003.jsonl"
    text = (folder / "step-000002.jsonl").read_text()
    torn.write_text(text + text.splitlines()[0][:40])
    try:
        out = _show(tiny_run, "--step", "3", "--episode", "1")
    finally:
        torn.unlink()
    assert out.exit_code == 0, out.output
    assert "episode #1 of 2" in out.output
    assert "warning:" in out.stderr and "torn write" in out.stderr


def test_html_page_is_self_contained_and_renders_in_chromium(
    tiny_run: TinyRun, tmp_path: Path
) -> None:
    page = tmp_path / "step.html"
    out = _show(tiny_run, "--html", str(page))
    assert out.exit_code == 0 and "wrote 2 episodes" in out.output
    html = page.read_text()
    assert html.count('<section class="episode"') == 2
    for external in ("<script", "src=", "href=", "@import", "url("):
        assert external not in html  # inline CSS only, nothing to fetch, no script
    with chromium_tab(tmp_path) as tab:
        tab.page.goto(page.as_uri())
        title = f"factor run {tiny_run.summary.run_id[:12]}: training step 2"
        assert tab.page.title() == title
        assert tab.page.locator("section.episode").count() == 2
        assert tab.page.locator("tr.turn").count() == sum(
            len(e.turns) for e in tiny_run.transcript("step-000002.jsonl")
        )
        assert tab.page.locator("span.tok").count() > 0
        assert tab.page.locator("section.episode h2").first.is_visible()
    assert tab.errors == []
    assert tab.requests == [page.as_uri()]  # the page itself, nothing else


def test_eval_html_page_holds_every_eval_episode(tiny_run: TinyRun, tmp_path: Path) -> None:
    page = tmp_path / "eval.html"
    out = _show(tiny_run, "--eval", "--html", str(page))
    assert out.exit_code == 0, out.output
    html = page.read_text()
    assert html.count('<section class="episode"') == 2 and "eval after step 2" in html
