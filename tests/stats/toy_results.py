"""The toy item-level results several stats tests check by hand (this folder is on sys.path).

Env "alf": categories x (items i1, i2) and y (item i3); env "ws": one category, items w1, w2.
Successes per (method, seed), in item order i1 i2 i3 | w1 w2:

    A seed 1: 1 1 0 | 1 1   -> alf (1 + 0)/2 = 0.50, ws 1.0
    A seed 2: 1 0 1 | 1 0   -> alf (0.5 + 1)/2 = 0.75, ws 0.5
    B seed 1: 0 0 1 | 0 0   -> alf (0 + 1)/2 = 0.50, ws 0.0
    B seed 2: 1 1 0 | 1 0   -> alf (1 + 0)/2 = 0.50, ws 0.5
"""

SUCCESS = {
    ("A", 1): [1, 1, 0, 1, 1],
    ("A", 2): [1, 0, 1, 1, 0],
    ("B", 1): [0, 0, 1, 0, 0],
    ("B", 2): [1, 1, 0, 1, 0],
}
ITEMS = [
    ("alf", "i1", "x"),
    ("alf", "i2", "x"),
    ("alf", "i3", "y"),
    ("ws", "w1", "all"),
    ("ws", "w2", "all"),
]
