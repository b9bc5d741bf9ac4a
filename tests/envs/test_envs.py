"""TextWorldExpress and ScienceWorld adapters on the real engines; restore; the crash pool."""

from __future__ import annotations

import pytest

from factor_cli.envs import (
    EnvCrashed,
    EnvError,
    RestoreMismatch,
    UnknownInstance,
    availability,
    make_env,
)
from factor_cli.envs.pool import EnvPool

twx_missing = availability("twx")
sw_missing = availability("scienceworld")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
needs_sw = pytest.mark.skipif(sw_missing is not None, reason=f"scienceworld: {sw_missing}")


@pytest.fixture(scope="module")
def twx():
    env = make_env("twx")
    yield env
    env.close()


def play(env, instance: str, actions: list[str]) -> list[str]:
    obs = [env.reset(instance)]
    for a in actions:
        obs.append(env.step(a).observation)
        if env.done:
            break
    return obs


@needs_twx
@pytest.mark.parametrize(
    "instance", ["coin/7", "coin/20003", "cookingworld/3", "cookingworld/20011"]
)
def test_twx_gold_path_wins(twx, instance: str) -> None:
    gold = twx.gold_actions(instance)
    play(twx, instance, gold)
    out = twx.outcome()
    assert twx.done and out.success and out.outcome == 1.0 and out.turns == len(gold)
    assert out.invalid_actions == 0


@needs_twx
def test_twx_invalid_action_and_partial_score(twx) -> None:
    twx.reset("cookingworld/3")
    step = twx.step("dance with the fridge")
    assert not step.valid and not step.done and twx.invalid_actions == 1
    gold = twx.gold_actions("cookingworld/3")
    play(twx, "cookingworld/3", gold[:-1])  # every subgoal but eating the meal
    assert 0.0 < twx.outcome().outcome < 1.0 and not twx.outcome().success


@needs_twx
def test_twx_restore_checks_observations(twx) -> None:
    gold = twx.gold_actions("cookingworld/5")
    recorded = play(twx, "cookingworld/5", gold[:6])
    assert twx.restore("cookingworld/5", gold[:6], recorded) == recorded[-1]
    assert twx.actions == gold[:6]
    tampered = [*recorded[:3], recorded[3] + " A dragon appears.", *recorded[4:]]
    with pytest.raises(RestoreMismatch, match="diverged at observation 3"):
        twx.restore("cookingworld/5", gold[:6], tampered)


@needs_twx
def test_twx_instances_share_one_jvm_independently() -> None:
    a, b = make_env("twx"), make_env("twx")
    try:
        assert a._jvm is b._jvm
        ga, gb = a.gold_actions("coin/11"), b.gold_actions("cookingworld/9")
        seq_a, seq_b = play(a, "coin/11", ga), play(b, "cookingworld/9", gb)
        a.reset("coin/11")
        b.reset("cookingworld/9")
        inter_a, inter_b = [seq_a[0]], [seq_b[0]]
        for i in range(max(len(ga), len(gb))):
            if i < len(ga):
                inter_a.append(a.step(ga[i]).observation)
            if i < len(gb):
                inter_b.append(b.step(gb[i]).observation)
        assert (inter_a, inter_b) == (seq_a, seq_b)
        a.close()
        assert b.reset("coin/11") == seq_a[0]  # closing one user keeps the shared JVM alive
    finally:
        a.close()
        b.close()


@needs_twx
def test_twx_turn_limit_and_errors() -> None:
    env = make_env("twx", max_turns=3)
    try:
        env.reset("coin/2")
        for _ in range(3):
            step = env.step("look around")
        assert step.done and step.info.get("truncated") and not env.outcome().success
        with pytest.raises(EnvError, match="is over"):
            env.step("look around")
        for bad in ("coin", "chess/1", "coin/abc", "coin/5000"):
            with pytest.raises(UnknownInstance):
                env.reset(bad)
    finally:
        env.close()


@needs_twx
def test_pool_survives_a_killed_jvm() -> None:
    crashes = []
    with EnvPool("twx", 2, on_crash=crashes.append) as pool:
        pool.reset(0, "coin/3")
        pool.reset(1, "coin/4")
        pool[0]._jvm.gateway.java_process.kill()
        pool[0]._jvm.gateway.java_process.wait()
        with pytest.raises(EnvCrashed, match="crashed in slot 0"):
            pool.step(0, "look around")
        assert len(pool.crashes) == 1 and crashes[0].instance_id == "coin/3"
        with pytest.raises(EnvCrashed, match="episode lost"):
            pool.step(1, "look around")  # same JVM: its episode is gone too, and says so
        assert pool.reset(0, "coin/3").startswith("You are in")
        assert pool.step(0, "look around").observation


class _ManglesCtrlC:
    """An engine client that fails inside its own Ctrl-C handler, as py4j 0.10.9 does."""

    instance_id = "coin/3"

    def step(self, action: str):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise AttributeError("'ClientServerConnection' has no attribute 'shutdown'")  # noqa: B904

    def close(self) -> None:
        pass


def test_pool_hands_back_a_mangled_ctrl_c_as_the_interrupt(monkeypatch) -> None:
    """Ctrl-C during an engine call must stop the run, not count as a crash that loses the
    episode (which ended a Ctrl-C'd training run with "every episode was lost", exit 1)."""
    import factor_cli.envs.pool as pool_mod

    monkeypatch.setattr(pool_mod, "make_env", lambda name, **kw: _ManglesCtrlC())
    with EnvPool("twx", 1) as pool:
        with pytest.raises(KeyboardInterrupt):
            pool.step(0, "look around")
        assert pool.crashes == []


@pytest.fixture(scope="module")
def sw():
    env = make_env("scienceworld")
    yield env
    env.close()


@needs_sw
def test_scienceworld_gold_path_success(sw) -> None:
    gold = sw.gold_actions("melt/L0/4")
    play(sw, "melt/L0/4", gold)
    out = sw.outcome()
    assert out.success and out.score == 100 and out.outcome == 1.0
    assert sw.category("melt/L0/4") == "melt/L0"
    assert "melt" in sw.task_description()


@needs_sw
def test_scienceworld_wrong_focus_is_failure(sw) -> None:
    sw.reset("melt/L0/4")
    step = sw.step("focus on agent")
    assert step.done and step.score < 0 and not sw.outcome().success and sw.outcome().outcome == 0.0


@needs_sw
def test_scienceworld_restore_and_invalid(sw) -> None:
    gold = sw.gold_actions("boil/L1/2")
    recorded = play(sw, "boil/L1/2", gold[:5])
    assert sw.normalize(sw.restore("boil/L1/2", gold[:5], recorded)) == sw.normalize(recorded[-1])
    with pytest.raises(RestoreMismatch):
        sw.restore(
            "boil/L1/2", gold[:5], [*recorded[:2], "This room is called the moon.", *recorded[3:]]
        )
    sw.reset("boil/L2/2")
    assert not sw.step("fly to the moon").valid
    assert sw.valid_actions()
    for bad in ("boil/L3/2", "boil/L0", "fly/L0/1", "boil/L0/9999"):
        with pytest.raises(UnknownInstance):
            sw.reset(bad)


@needs_sw
def test_scienceworld_normalize_ignores_order_only() -> None:
    from factor_cli.envs.scienceworld import normalize_lines

    a = "This room is called the hallway.\n\tA door to the kitchen\n\tA door to the bedroom"
    b = "This room is called the hallway.\n\tA door to the bedroom\n\tA door to the kitchen  "
    c = "This room is called the hallway.\n\tA door to the bedroom\n\tA door to the garage"
    assert normalize_lines(a) == normalize_lines(b) != normalize_lines(c)


@needs_twx
def test_jvm_closed_on_ctrl_c() -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        from factor_cli.envs import make_env
        try:
            with make_env("twx") as env:
                env.reset("coin/1")
                proc = env._jvm.gateway.java_process
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        proc.wait(timeout=10)
        print("jvm exit", proc.returncode is not None)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "jvm exit True" in out.stdout


def test_missing_java_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from factor_cli.envs import EnvUnavailable, jvm

    monkeypatch.setattr(jvm.shutil, "which", lambda name: None)
    assert "Java 17+ is missing" in (availability("twx") or "")
    with pytest.raises(EnvUnavailable, match="apt-get install -y default-jre-headless"):
        make_env("scienceworld")


def test_unknown_environment() -> None:
    with pytest.raises(ValueError, match="unknown environment 'chess'; valid:"):
        make_env("chess")
