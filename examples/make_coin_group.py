"""Write examples/coin_group.json: a hand-made group in the recorded-trajectory format.

It imitates four rollouts of one TextWorldExpress coin-collector game (two find the coin, two do
not). Token log-probs are invented but shaped like real ones: the teacher, which sees the
feedback Phi_t, is more confident on the tokens the feedback confirms ("north", "coin") and less
on those it contradicts. It exists to demonstrate `factor credit explain`; it is not a result.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OBS = {
    "kitchen": "You are in the kitchen. To the North you see a closed wooden door.",
    "pantry": "You are in the pantry. You see a coin on the shelf.",
    "hall": "You are in the hallway. To the South you see an open door.",
}
STEPS = {
    "open door to north": (
        ["open", " door", " to", " north"],
        "You open the wooden door.",
        "kitchen",
        [0, 0, 1, 2],
    ),
    "move north": (["move", " north"], "You move north. You are in the pantry.", "kitchen", [1, 2]),
    "take coin": (["take", " coin"], "You take the coin. You won!", "pantry", [1, 2]),
    "move south": (
        ["move", " south"],
        "You can't move there, the door is closed.",
        "kitchen",
        [0, -2],
    ),
    "look around": (["look", " around"], OBS["kitchen"], "kitchen", [0, 0]),
    "take shelf": (["take", " shelf"], "You can't take that.", "pantry", [0, -2]),
}
PLAYS = [
    ("win-direct", 1.0, ["open door to north", "move north", "take coin"]),
    ("lost-wander", 0.0, ["look around", "move south", "look around", "move south"]),
    (
        "win-late",
        1.0,
        ["look around", "open door to north", "move north", "take shelf", "take coin"],
    ),
    ("lost-shelf", 0.0, ["open door to north", "move north", "take shelf", "take shelf"]),
]


def main() -> None:
    rng = random.Random(0)
    trajectories = []
    for tid, outcome, plan in PLAYS:
        actions = []
        for t, text in enumerate(plan):
            tokens, feedback, room, boost = STEPS[text]
            old = [round(-rng.uniform(0.05, 2.5), 3) for _ in tokens]
            teacher = [
                round(min(-0.01, o + 0.6 * b + rng.uniform(-0.2, 0.2)), 3)
                for o, b in zip(old, boost)
            ]
            progress = (t + 1) / len(plan)
            value = round(
                min(0.95, max(0.05, 0.5 + (outcome - 0.5) * progress + rng.uniform(-0.1, 0.1))), 3
            )
            actions.append(
                {
                    "text": text,
                    "tokens": tokens,
                    "logp_old": old,
                    "logp_teacher": teacher,
                    "value": value,
                    "feedback": feedback,
                    "observation": OBS[room],
                }
            )
        trajectories.append({"id": tid, "outcome": outcome, "group": 0, "actions": actions})
    group = {
        "env": "twx",
        "instance": "coin/17",
        "convention": "leave-one-out",
        "step": 20,
        "trajectories": trajectories,
    }
    out = Path(__file__).with_name("coin_group.json")
    out.write_text(json.dumps(group, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
