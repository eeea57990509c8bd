"""normlab.report.analysis: the per-block series of training-time diagnostics read from columns (``Curve``) equal
what the list-of-tuples code computed, exactly."""

from __future__ import annotations

import math
import random
from statistics import mean

from normlab.report.analysis import _train_series, by_step
from normlab.rundir.curves import Curve


def _old_train_series(curves, prefixes):
    """The list / dict implementation the columns replaced, as it was."""
    per_prefix = []
    for prefix in prefixes:
        keys = {int(k[len(prefix):]): pts for k, pts in curves.items()
                if k.startswith(prefix) and k[len(prefix):].isdigit()}
        if len(keys) < 2:
            continue
        per_prefix.append([dict(keys[b]) for b in sorted(keys)])
    if not per_prefix:
        return None
    steps = sorted(set.intersection(*(set(m) for ms in per_prefix for m in ms)))
    if not steps:
        return None
    keep = [s for s in steps if s >= steps[-1] / 2] or steps[-1:]
    depth = min(len(ms) for ms in per_prefix)
    return [mean(math.sqrt(sum(ms[b][s] ** 2 for ms in per_prefix)) for s in keep) for b in range(depth)]


def test_train_series_from_curves_equals_the_list_implementation():
    rng = random.Random(0)
    prefixes = ["diag/grad_norm/attn/", "diag/grad_norm/mlp/", "diag/grad_norm/norm/"]
    for trial in range(20):
        curves = {}
        for p in prefixes[: rng.randint(1, 3)]:
            for b in range(rng.randint(1, 6)):
                steps = sorted(rng.sample(range(0, 400, 10), rng.randint(1, 30)))
                pts = [(s, rng.lognormvariate(0, 2)) for s in steps]
                pts += [(s, rng.random()) for s in rng.sample(steps, min(2, len(steps)))]  # a step logged twice
                rng.shuffle(pts)
                curves[f"{p}{b}"] = Curve(pts) if trial % 2 else pts
        curves["diag/grad_norm/attn/x"] = [(0, 1.0)]  # not a block index: ignored by both
        assert _train_series(curves, prefixes) == _old_train_series(curves, prefixes)


def test_by_step_keeps_the_last_value_of_each_step():
    pts = [(3, 1.0), (1, 2.0), (3, 4.0), (2, 0.5), (1, 7.0)]
    s, v = by_step(Curve(pts))
    assert list(zip(s.tolist(), v.tolist())) == sorted(dict(pts).items())
