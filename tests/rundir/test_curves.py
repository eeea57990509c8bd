"""normlab.rundir.curves: a ``Curve`` reads as the list of ``(step, value)`` tuples it replaces."""

from __future__ import annotations

import random

from normlab.rundir.curves import Curve


def test_a_curve_reads_as_its_list_of_points():
    rng = random.Random(0)
    pts = [(rng.randrange(50), rng.random()) for _ in range(200)]
    c = Curve(pts)
    assert len(c) == len(pts) and list(c) == pts and c == pts and c[-1] == pts[-1] and c[3] == pts[3]
    assert c[10:20] == pts[10:20] and isinstance(c[10:20], Curve)
    assert dict(c) == dict(pts) and sorted(c) == sorted(pts)
    assert [v for s, v in c if s >= 25] == [v for s, v in pts if s >= 25]
    c.sort()
    pts.sort()
    assert list(c) == pts  # list.sort's order of (step, value) tuples, ties on step by value
    c.append((99, 0.5))
    assert c[-1] == (99, 0.5) and bool(Curve()) is False and Curve() == []
    inc = Curve([(1, 3.0), (2, 1.0), (5, 2.0)])
    steps = inc.steps
    inc.sort()
    assert inc.steps is steps  # already in order: nothing copied
