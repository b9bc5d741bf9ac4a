"""Transcript files: the JSONL schema round trip, torn and corrupt lines, finding a run by a
prefix of its id, and the deterministic choice of the sample trajectories."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from factor_cli.ledger import transcripts as tx
from factor_cli.ledger.transcripts import (
    EpisodeRecord,
    TranscriptError,
    TurnRecord,
    file_name,
    parse_jsonl,
    parse_name,
    ranges,
    to_jsonl,
)
from factor_cli.rollout.runner import Episode, Start
from factor_cli.rollout.transcripts import sample_trajectories


def _episode(k: int) -> EpisodeRecord:
    turn = TurnRecord(
        t=0, prompt="x_0", observation="o", reply="<action>go</action>", action="go",
        valid=True, feedback="ok", reward=1.0, done=True, admissible=["go", "stay"],
        tokens=["<action>", "go", "</action>"], action_mask=[False, True, False],
        weights=[None, 1.0, None], credit=0.5, value=0.25,
    )  # fmt: skip
    return EpisodeRecord(
        kind="step", step=3, episode=k, instance=f"coin/{k}", group=0, outcome=1.0,
        success=True, score=1.0, turns=[turn], a_seq=0.5, v0=0.5,
    )  # fmt: skip


def test_records_round_trip_through_jsonl() -> None:
    records = [_episode(0), _episode(1)]
    text = to_jsonl(records)
    assert text.count("\n") == 2 and text.endswith("\n")
    back, torn = parse_jsonl(text, "f")
    assert back == records and not torn
    assert back[0].turns[0].mean_weight == 1.0 and back[0].credit_sum == 0.5


@pytest.mark.parametrize("tail", ['{"kind": "step", "st', '{"kind": "step", "st\n'])
def test_a_torn_last_line_is_skipped_and_flagged(tail: str) -> None:
    back, torn = parse_jsonl(to_jsonl([_episode(0), _episode(1)]) + tail, "f")
    assert torn and [e.episode for e in back] == [0, 1]


def test_a_bad_line_before_the_last_is_an_error_naming_it() -> None:
    text = to_jsonl([_episode(0)]) + "{oops\n" + to_jsonl([_episode(1)])
    with pytest.raises(TranscriptError, match=r"^transcripts/x line 2: not JSON"):
        parse_jsonl(text, "transcripts/x")
    row = _episode(0).to_json()
    del row["turns"][0]["reward"]
    with pytest.raises(TranscriptError, match="line 1 turn 0: missing field 'reward'"):
        parse_jsonl(json.dumps(row) + "\n", "f")


def test_file_names_and_ranges() -> None:
    assert (
        file_name("step", 7) == "step-000007.jsonl" and file_name("eval", 0) == "eval-000000.jsonl"
    )
    assert parse_name("eval-000012.jsonl") == ("eval", 12)
    assert parse_name("notes.txt") is None and parse_name("step-1.json") is None
    assert ranges([0, 1, 2, 4, 6, 7]) == "0-2, 4, 6-7" and ranges([5]) == "5"


class _Page(list):
    """One page of ``search_runs`` results (the last: no next-page token)."""

    token = None


class _FakeClient:
    """Answers what ``find_run`` asks an MLflow client: the experiment, its runs, one run."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def get_experiment_by_name(self, name: str) -> object:
        return SimpleNamespace(experiment_id="1", lifecycle_stage="active")

    def search_runs(self, exp_ids: list[str], max_results: int, page_token: object) -> _Page:
        return _Page(SimpleNamespace(info=SimpleNamespace(run_id=i)) for i in self.ids)

    def get_run(self, run_id: str) -> object:
        if run_id not in self.ids:
            raise KeyError(run_id)
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))


def _client(monkeypatch: pytest.MonkeyPatch, ids: list[str]) -> None:
    fake = _FakeClient(ids)
    monkeypatch.setattr(tx, "_client", lambda uri: ("sqlite:///fake.db", fake))


def test_a_run_is_found_by_a_unique_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = "ab12" + "0" * 28, "ab34" + "0" * 28
    _client(monkeypatch, [a, b])
    assert tx.find_run("AB1") == a and tx.find_run(b) == b
    with pytest.raises(TranscriptError, match="ambiguous, 2 runs start with it"):
        tx.find_run("ab")
    with pytest.raises(TranscriptError, match="no run id starts with it"):
        tx.find_run("ffff")
    with pytest.raises(TranscriptError, match="no such run"):
        tx.find_run("f" * 32)
    for bad in ("", "xyz", "a" * 33):
        with pytest.raises(TranscriptError, match="not a ledger run id"):
            tx.find_run(bad)


def test_sample_trajectories_take_the_first_of_each_group_first() -> None:
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    eps = [Episode(start=Start(f"i{g}", group=g)) for g in groups]
    assert sample_trajectories(eps, 4) == [0, 3, 6, 1]
    assert sample_trajectories(eps, 2) == [0, 3]
    assert sample_trajectories(eps, 50) == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    assert sample_trajectories(eps, 0) == []
