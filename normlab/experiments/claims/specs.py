"""The published claims the suite re-measures, as pre-registered definitions: one YAML file per claim in
``defs/`` (discovered; their order in ``suite.yaml``), loaded into ``Claim`` objects (``CLAIMS``; ``get_claim``).

A definition (``defs/<name>.yaml``)::

    name: cod-lns                       # the file's stem
    claim: LayerNorm Scaling reduces the variance growth of Pre-LN
    paper: Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)
    question:                           # what the verdict is decided on (hashed)
      metric: slope(Pre-LN) - slope(Pre-LN + LayerNorm Scaling), deep models (nats/block)
      expected: '> 0'                   # as the page prints it
      direction: greater                # greater | less | within | exact (normlab.decide.verdicts)
      test: t                           # optional: one of TESTS; default from the direction
      no_effect: 0.0                    # optional: the null value (default 0)
      margin: 0.05                      # within: the equivalence margin; exact: tolerance instead
      practical_margin: 0.01            # optional: TOST margin of "within margin"
      seeds: 5                          # optional: the seed count it is pre-registered with (default: budget's)
      observable: pre_slope_change      # optional: details key whose 95% CI must lie above 0
      must_learn: [best_grid_dyt]       # optional: details keys holding a model's final loss (did-not-learn rule)
      learn_unit: bits/byte             # their unit: bits/byte (default) or nats/byte
    variants: [deep_pre, deep_lns]      # named configs of normlab.experiments.claims.variants (hashed: recipes)
    measure: {name: diff_slope, args: [deep_lns]}   # a measure registered by name (hashed)
    beside: [slope_init_pre]            # optional: details keys whose mean is printed beside the value
    meaning: ... source: ... deviations: ...         # prose for docs/claims.md: the recipe, never an outcome

**Pre-registration.** ``spec_hash(claim)`` hashes the definition only (``Claim.definition``: metric, direction,
measure and its arguments, null, margins, tolerance, test, seeds, the observability rule, and every variant's
recipe with the full budget), never the prose. docs/claims.md records each claim's hash; a claim whose hash differs
from the recorded one needs a ``Revision`` from that hash in ``normlab/evidence/revisions.yaml`` (the history of
changes: date, what changed, why, the verdict before, the hash before), which ``normlab claims`` prints and
docs/claims.md lists under "Definitions revised" (``tests/experiments/claims/test_specs.py``). Changing what a
measure computes means
registering it under a new name, so the change shows in the hash.

Adding a claim: one ``defs/<name>.yaml``, its name in ``suite.yaml``, and, when no measure fits, one function
registered with ``measure_registry.register_measure``. A new claim needs no revision: it has no verdict yet.
Definitions hold no dates, commit hashes or measured numbers (``tests/experiments/claims/test_specs.py`` checks):
results are in the
stored ``claims.json`` and the page generated from it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from normlab.errors import NormlabError, check_keys, did_you_mean
from normlab.experiments.claims.variants import ALL_VARIANTS, GRID_VARIANTS, recipe

TESTS = ("t", "equivalence", "exact", "collapse")
"""How a claim is judged (normlab.decide.verdicts): ``t`` a two-sided one-sample t-test of the per-seed
values against ``null``, Holm-adjusted over the family of claims with a significance test; ``equivalence`` the
same against both ends of ``null ± margin``; ``exact`` every seed within ``tolerance`` (no test); ``collapse`` the
collapse rate per condition (Clopper-Pearson) and the t-test of the loss difference over the seeds where neither
run collapsed."""
DIRECTIONS = ("greater", "less", "within", "exact")
LEARN_UNITS = ("bits/byte", "nats/byte")


@dataclass(frozen=True)
class Revision:
    """One change of a claim's definition (or of a rule that changed its verdict) after a verdict was published."""

    date: str            # YYYY-MM-DD
    what: str            # what changed (metric, recipe, test, margin, rule)
    why: str
    verdict_before: str  # the published verdict (and value) under the earlier definition
    hash_before: str = ""  # spec_hash before the change ("" where it did not change or was not recorded yet)
    # the seeds of every result the change was made after: a verdict on any of them cannot confirm the new definition
    seeds_seen: tuple[int, ...] = ()
    time: str = ""  # HH:MM UTC, where results of the same day came after it (their claims.json's finished_utc)

    def __post_init__(self) -> None:
        seen = self.seeds_seen
        if not isinstance(seen, (list, tuple)) or not seen or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seen):
            raise NormlabError(f"normlab/evidence/revisions.yaml: the revision of {self.date} ({self.what[:40]}...) "
                               f"needs seeds_seen, a non-empty list of the seeds its results came from, got {seen!r}")
        object.__setattr__(self, "seeds_seen", tuple(seen))
        if not isinstance(self.time, str) or (self.time and not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", self.time)):
            raise NormlabError(f"normlab/evidence/revisions.yaml: the revision of {self.date} ({self.what[:40]}...) "
                               f"has time {self.time!r}; allowed: HH:MM (UTC) as a quoted string, or none")

    def to_dict(self) -> dict:
        return {"date": self.date, "what": self.what, "why": self.why, "verdict_before": self.verdict_before,
                "hash_before": self.hash_before, "seeds_seen": list(self.seeds_seen),
                **({"time": self.time} if self.time else {})}


def claim_seeds(report: dict[str, Any], claim: dict[str, Any]) -> list[int]:
    """The seeds a stored claim was measured on: its ``seeds`` list, else (a report written before claims stored
    them) the report's ``seeds`` count from its budget's first seed."""
    if isinstance(claim.get("seeds"), list):
        return [int(s) for s in claim["seeds"]]
    base = int((report.get("budget_spec") or {}).get("seed_base", 0))
    return list(range(base, base + int(report.get("seeds") or 0)))


def confirms(revisions: tuple[Revision, ...], seeds: list[int]) -> bool:
    """Whether a verdict on ``seeds`` is confirmatory for a definition with ``revisions``: none of its revisions was
    made after results on any of these seeds (runs that shaped a design cannot confirm it). Unknown seeds (an empty
    list) confirm nothing for a revised definition."""
    if revisions and not seeds:
        return False
    return not any(set(r.seeds_seen) & set(seeds) for r in revisions)


@dataclass(frozen=True)
class Claim:
    name: str
    claim: str
    paper: str
    metric: str          # what one seed's value is
    expected: str        # human-readable expected direction
    direction: str       # stats.verdict direction
    variants: tuple[str, ...]
    measure: str         # the measure: a name registered in normlab.experiments.claims.measure_registry
    args: tuple = ()     # its extra arguments (e.g. the two variants of a bits/byte difference)
    null: float = 0.0
    margin: float | None = None
    tolerance: float | None = None
    meaning: str = ""    # longer explanation for docs/claims.md
    source: str = ""     # where the recipe / metric comes from (paper section, authors' script)
    deviations: str = ""  # what differs from the paper's recipe, forced by scale or by choice, and why
    test: str = ""       # one of TESTS; "" = from the direction (exact -> exact, within -> equivalence, else t)
    seeds: int | None = None  # seeds the claim is pre-registered with (None: the budget's)
    practical_margin: float | None = None  # TOST margin of "within margin"
    observable: str = ""  # a details key: the phenomenon is present at this scale only when its per-seed CI > 0
    # details keys holding a model's final loss per seed (unit ``learn_unit``), checked against the unigram
    # bits/byte minus normlab.stats.learning.DID_NOT_LEARN_MARGIN: a claim about a model that did not learn is "not
    # observable at this scale" (the one did-not-learn rule; the suite's rule, so not hashed, like ``beside``)
    must_learn: tuple[str, ...] = ()
    revised: tuple[Revision, ...] = ()  # from normlab/evidence/revisions.yaml
    beside: tuple[str, ...] = ()  # details keys whose mean over seeds is printed beside the value (not hashed)
    learn_unit: str = "bits/byte"
    # a state claim: the details key of the same quantity at the runs' own initialisation; the claim is tested on
    # the per-seed change from it (normlab.decide.verdicts.judge_family: "present at initialisation")
    at_init: str = ""

    def __post_init__(self) -> None:
        if not self.test:
            object.__setattr__(self, "test", {"exact": "exact", "within": "equivalence"}.get(self.direction, "t"))
        if self.test not in TESTS:
            raise ValueError(f"claim {self.name}: test must be one of {TESTS}, got {self.test!r}")

    def definition(self) -> dict:
        """What defines the verdict (what ``spec_hash`` hashes): prose, paper and revisions are left out."""
        return {"name": self.name, "metric": self.metric, "direction": self.direction, "measure": self.measure,
                "args": list(self.args), "null": self.null, "margin": self.margin, "tolerance": self.tolerance,
                "test": self.test, "seeds": self.seeds, "practical_margin": self.practical_margin,
                "observable": self.observable, "variants": list(self.variants),
                "recipe": {v: recipe(v) for v in self.variants}, **({"at_init": self.at_init} if self.at_init else {})}

    def learned_loss_bpb(self, x: float) -> float:
        """A ``must_learn`` value in bits/byte (a nats/byte loss divided by ln 2)."""
        return x / math.log(2) if self.learn_unit == "nats/byte" else x


def spec_hash(claim: Claim) -> str:
    """12 hex digits of the SHA-256 of ``claim.definition()`` (sorted-key JSON)."""
    blob = json.dumps(claim.definition(), sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


# -- loading the definitions ------------------------------------------------------------------------------------
TOP_KEYS = ("name", "claim", "paper", "question", "variants", "measure", "beside", "meaning", "source", "deviations")
QUESTION_KEYS = ("metric", "expected", "direction", "test", "no_effect", "margin", "tolerance", "practical_margin",
                 "seeds", "observable", "must_learn", "learn_unit", "at_init")
MEASURE_KEYS = ("name", "args")
_REQUIRED = {"top": ("name", "claim", "paper", "question", "variants", "measure"),
             "question": ("metric", "expected", "direction")}


def _keys(d: Any, allowed: tuple[str, ...], required: tuple[str, ...], where: str) -> dict:
    if not isinstance(d, dict):
        raise NormlabError(f"{where} must be a mapping, got {type(d).__name__}")
    check_keys(d, allowed, where)
    missing = [k for k in required if k not in d]
    if missing:
        raise NormlabError(f"{where}: missing {', '.join(missing)}")
    return d


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise NormlabError(f"{where} must be a non-empty string, got {v!r}")
    return v


def _number(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise NormlabError(f"{where} must be a finite number, got {v!r}")
    return float(v)


def _names(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise NormlabError(f"{where} must be a list of names, got {v!r}")
    return tuple(v)


def claim_from_dict(d: Any, source: str, revised: tuple[Revision, ...] = ()) -> Claim:
    """A ``Claim`` from one parsed definition (``source`` names it in errors); bad input is one NormlabError."""
    d = _keys(d, TOP_KEYS, _REQUIRED["top"], source)
    q = _keys(d["question"], QUESTION_KEYS, _REQUIRED["question"], f"{source}: question")
    m = d["measure"]
    m = _keys(m, MEASURE_KEYS, ("name",), f"{source}: measure")
    direction = q["direction"]
    if direction not in DIRECTIONS:
        raise NormlabError(f"{source}: question: direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    test = q.get("test", "")
    if test and test not in TESTS:
        raise NormlabError(f"{source}: question: test must be one of {', '.join(TESTS)}, got {test!r}")
    variants = _names(d["variants"], f"{source}: variants")
    for v in variants:
        if v not in ALL_VARIANTS:
            raise NormlabError(f"{source}: unknown variant '{v}'{did_you_mean(v, ALL_VARIANTS)}")
    args = m.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in args):
        raise NormlabError(f"{source}: measure: args must be a list of names and integers, got {args!r}")
    seeds = q.get("seeds")
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise NormlabError(f"{source}: question: seeds must be an integer >= 1, got {seeds!r}")
    unit = q.get("learn_unit", "bits/byte")
    if unit not in LEARN_UNITS:
        raise NormlabError(f"{source}: question: learn_unit must be one of {', '.join(LEARN_UNITS)}, got {unit!r}")
    prose = {k: _text(d[k], f"{source}: {k}") for k in ("meaning", "source", "deviations") if k in d}
    return Claim(name=_text(d["name"], f"{source}: name"), claim=_text(d["claim"], f"{source}: claim"),
                 paper=_text(d["paper"], f"{source}: paper"), metric=_text(q["metric"], f"{source}: metric"),
                 expected=_text(q["expected"], f"{source}: expected"), direction=direction, variants=variants,
                 measure=_text(m["name"], f"{source}: measure: name"), args=tuple(args),
                 null=_number(q.get("no_effect", 0.0), f"{source}: question: no_effect"),
                 margin=_number(q.get("margin"), f"{source}: question: margin"),
                 tolerance=_number(q.get("tolerance"), f"{source}: question: tolerance"),
                 test=test, seeds=seeds,
                 practical_margin=_number(q.get("practical_margin"), f"{source}: question: practical_margin"),
                 observable=q.get("observable") or "",
                 at_init=_text(q["at_init"], f"{source}: question: at_init") if "at_init" in q else "",
                 must_learn=_names(q.get("must_learn", []), f"{source}: question: must_learn"), learn_unit=unit,
                 beside=_names(d.get("beside", []), f"{source}: beside"), revised=revised, **prose)


def _package_file(*parts: str) -> Any:
    return resources.files("normlab").joinpath(*parts)


def load_revisions() -> dict[str, tuple[Revision, ...]]:
    """Claim name -> its revisions, in the order normlab/evidence/revisions.yaml lists them."""
    rows = yaml.safe_load(_package_file("evidence", "revisions.yaml").read_text(encoding="utf-8")) or []
    out: dict[str, list[Revision]] = {}
    for r in rows:
        r = dict(r)
        out.setdefault(r.pop("claim"), []).append(Revision(**r))
    return {k: tuple(v) for k, v in out.items()}


def load_claims() -> list[Claim]:
    """Every definition in ``defs/`` in the order of ``suite.yaml``, with its revisions. A definition not listed
    there, a listed name without a definition, or a file whose ``name`` is not its stem is an error."""
    here = _package_file("experiments", "claims")
    order = (yaml.safe_load(here.joinpath("suite.yaml").read_text(encoding="utf-8")) or {}).get("claims") or []
    files = {p.name[:-len(".yaml")]: p for p in here.joinpath("defs").iterdir() if p.name.endswith(".yaml")}
    if sorted(order) != sorted(files) or len(set(order)) != len(order):
        raise NormlabError(f"claims/suite.yaml lists {sorted(set(order) - set(files)) or 'no'} missing and misses "
                           f"{sorted(set(files) - set(order)) or 'no'} definition(s) of claims/defs/")
    revisions = load_revisions()
    unknown = sorted(set(revisions) - set(files))
    if unknown:
        raise NormlabError(f"normlab/evidence/revisions.yaml names no such claim: {', '.join(unknown)}")
    claims = []
    for name in order:
        source = f"claims/defs/{name}.yaml"
        c = claim_from_dict(yaml.safe_load(files[name].read_text(encoding="utf-8")), source, revisions.get(name, ()))
        if c.name != name:
            raise NormlabError(f"{source}: name '{c.name}' is not the file's name")
        claims.append(c)
    return claims


CLAIMS: list[Claim] = load_claims()
CLAIM_NAMES = [c.name for c in CLAIMS]


def get_claim(name: str) -> Claim:
    """The registered claim ``name`` (one-line error with did-you-mean)."""
    for c in CLAIMS:
        if c.name == name:
            return c
    raise NormlabError(f"unknown claim '{name}'{did_you_mean(name, CLAIM_NAMES)}; allowed: {', '.join(CLAIM_NAMES)}")


def select(only: str | None) -> list[Claim]:
    """The claims named in ``only`` (comma-separated; all when empty), in the suite's order."""
    if not only:
        return list(CLAIMS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise NormlabError(f"--only needs at least one claim name, got '{only}'; allowed: {', '.join(CLAIM_NAMES)}")
    for n in names:
        get_claim(n)
    return [c for c in CLAIMS if c.name in names]


def grid_claim_names() -> set[str]:
    """The claims measured over the learning-rate grid."""
    return {c.name for c in CLAIMS if any(v in GRID_VARIANTS for v in c.variants)}
