"""The published claims the suite re-measures, as pre-registered specifications: one ``Claim`` per claim with its
text, paper, metric, expected direction, the run variants it needs (its recipe: normlab.experiments.claims.variants),
the name of the measurement that turns one seed's runs into one number (``measure`` + ``args``, a key of
``normlab.experiments.claims.measures.MEASURES``), the test that judges it (``test``), its seeds, its practical
margin, and the source and deviations docs/claims.md prints.

**Pre-registration.** ``spec_hash(claim)`` hashes everything that defines the verdict (metric, direction, measure and
its arguments, null, margins, tolerance, test, seeds, the observability rule, and the recipe: every variant's
overrides and the full budget). docs/claims.md records each claim's hash; a claim whose hash differs from the
recorded one must carry a ``Revision`` in ``revised`` (date, what changed, why, the verdict before, and the hash
before), which ``normlab claims`` prints and docs/claims.md lists under "Definitions revised", so every forking path
is visible (``tests/test_specs.py``). Changing what a measurement function computes means registering it
under a new name, so the change shows in the hash.

Adding a claim: one ``Claim`` here (with its source and deviations; the fields after ``deviations`` have defaults,
so a claim written in the earlier format is a valid spec as it is) and, when no existing measurement fits, one
function registered in ``measures.MEASURES``; ``tests/test_claims.py`` checks every claim names a known measurement
and known variants. A new claim needs no ``revised`` entry: it has no published verdict yet.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from normlab.errors import NormlabError

TESTS = ("t", "equivalence", "exact", "collapse")
"""How a claim is judged (normlab.experiments.claims.stats): ``t`` a two-sided one-sample t-test of the per-seed
values against ``null``, Holm-adjusted over the family of claims with a significance test; ``equivalence`` the
same against both ends of ``null ± margin``; ``exact`` every seed within ``tolerance`` (no test); ``collapse`` the
collapse rate per condition (Clopper-Pearson) and the t-test of the loss difference over the seeds where neither
run collapsed."""


@dataclass(frozen=True)
class Revision:
    """One change of a claim's definition after a verdict was published."""

    date: str            # YYYY-MM-DD
    what: str            # what changed (metric, recipe, test, margin)
    why: str
    verdict_before: str  # the published verdict (and value) under the earlier definition
    hash_before: str = ""  # spec_hash before the change ("" for changes made before hashes were recorded)

    def to_dict(self) -> dict:
        return {"date": self.date, "what": self.what, "why": self.why, "verdict_before": self.verdict_before,
                "hash_before": self.hash_before}


@dataclass(frozen=True)
class Claim:
    name: str
    claim: str
    paper: str
    metric: str          # what one seed's value is
    expected: str        # human-readable expected direction
    direction: str       # stats.verdict direction
    variants: tuple[str, ...]
    measure: str         # the measurement: a key of normlab.experiments.claims.measures.MEASURES
    args: tuple = ()     # its extra arguments (e.g. the two variants of a bits/byte difference)
    null: float = 0.0
    margin: float | None = None
    tolerance: float | None = None
    meaning: str = ""    # longer explanation for docs/claims.md
    source: str = ""     # where the recipe / metric comes from (paper section, authors' script)
    deviations: str = ""  # what differs from the paper's setup, forced by scale or by choice, and why
    test: str = ""       # one of TESTS; "" = from the direction (exact -> exact, within -> equivalence, else t)
    seeds: int | None = None  # seeds the claim is pre-registered with (None: the budget's)
    practical_margin: float | None = None  # |mean - null| below this is "within margin", whatever the p-value
    observable: str = ""  # a details key: the phenomenon is present at this scale only when its per-seed CI > 0
    # details keys (bits/byte per seed, e.g. a model's best-of-grid loss) checked against the unigram bits/byte minus
    # normlab.experiments.lrgrid.DID_NOT_LEARN_MARGIN: the reason names a model that did not learn in some seed
    # (k of n). A note beside the verdict, never a change of it (not hashed, like ``beside``)
    must_learn: tuple[str, ...] = ()
    revised: tuple[Revision, ...] = ()
    beside: tuple[str, ...] = ()  # details keys whose mean over seeds is printed beside the value (not hashed)

    def __post_init__(self) -> None:
        if not self.test:
            object.__setattr__(self, "test", {"exact": "exact", "within": "equivalence"}.get(self.direction, "t"))
        if self.test not in TESTS:
            raise ValueError(f"claim {self.name}: test must be one of {TESTS}, got {self.test!r}")

    def definition(self) -> dict:
        """What defines the verdict (what ``spec_hash`` hashes): prose, paper and revisions are left out."""
        from normlab.experiments.claims.variants import recipe

        return {"name": self.name, "metric": self.metric, "direction": self.direction, "measure": self.measure,
                "args": list(self.args), "null": self.null, "margin": self.margin, "tolerance": self.tolerance,
                "test": self.test, "seeds": self.seeds, "practical_margin": self.practical_margin,
                "observable": self.observable, "variants": list(self.variants),
                "recipe": {v: recipe(v) for v in self.variants}}


def spec_hash(claim: Claim) -> str:
    """12 hex digits of the SHA-256 of ``claim.definition()`` (sorted-key JSON)."""
    blob = json.dumps(claim.definition(), sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


R1123 = "2026-11-23"   # faithful recipes (commit 6132de0), published in docs/claims.md 2026-11-24 (7f2686e)
R1125 = "2026-11-25"   # measures the initialisation cannot dominate, split outcomes, practical margins
R1126 = "2026-11-26"   # observability rules for measures that are 0 by construction when the phenomenon is absent
R1127 = "2026-11-27"   # one collapse / did-not-learn rule (normlab.stats.learning) on every path
ABSENT_WHY = ("the measure is 0 by construction when the phenomenon is absent, so a run without it cannot test the "
              "claim; the full run of 2026-11-26 found it in no seed, and 'inconclusive' did not say why")
BPB_MARGIN = 0.01      # bits/byte: a difference below it is "within margin" (bits/byte claims of this suite)
MARGIN_WHY = ("an effect below 0.01 bits/byte is smaller than the run-to-run spread of one model at this scale "
              "and of no practical use, whatever its p-value")
RANK_VARIANTS = ("ln", "dyt", "powernorm", "deep_pre", "deep_peri")  # the runs the label-free scores rank
WORTSMAN = ("Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training instabilities "
            "(arXiv:2309.14322)")
LR_SENSITIVITY = ("LR sensitivity = mean over the learning-rate grid of min(L, L_init) - L* (bits/byte; L final "
                  "validation bits/byte, L_init at initialisation, a diverged run scores L_init, L* the best of the "
                  "grid), per seed.")

CLAIMS: list[Claim] = [
    Claim("exact-conversion", "Pre-LN, Pre-RMSNorm and Pre-CRMSNorm compute the same function",
          "Jiang et al. 2023 (arXiv:2305.14858)", "max |logit diff| after converting a trained Pre-LN run to "
          "Pre-RMSNorm and Pre-CRMSNorm (fp32, 4 validation windows)", "<= 1e-4", "exact", ("ln",), "exact",
          tolerance=1e-4, meaning="Each seed's trained Pre-LN model is converted in memory (normlab.convert."
          "convert_model) to Pre-RMSNorm and to Pre-CRMSNorm; the value is the larger of the two max |logit "
          "differences|. Held when every seed is within the tolerance 1e-4.",
          source="paper section 3 (the conversion) and repo ZixuanJiang/pre-rmsnorm-transformer",
          deviations="none in the method; a small GPT instead of their ViT / GPT-2 models."),
    Claim("cod-growth", "In Pre-LN the residual-stream variance grows with depth",
          "Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)", "slope of ln(var) of block outputs vs block "
          "index, deep Pre-LN (nats/block)", "> 0", "greater", ("deep_pre",), "growth",
          meaning="Least-squares slope of ln(variance of the residual stream after block l) against l, pooled over "
                  "a fixed validation sample (normlab.diagnostics.depth, log_var_slope_blocks). exp(slope) is the "
                  "growth factor per block.",
          source="paper section 3 (variance of the Pre-LN output grows with depth; their figure of the "
                 "per-layer variance) and repo lmsdss/LayerNorm-Scaling",
          deviations="12 blocks of width 64 for 500 steps instead of LLaMA-130M..1B trained on C4; the growth is "
                     "summarised by one log-slope.",
          observable="pre_slope_change", beside=("slope_init_pre",),
          revised=(Revision(R1127, "observability rule: a state claim is judged on its end value only where "
                            "training changed the state in the claimed direction (pre_slope_change = slope_end - "
                            "slope_init, 95% CI above 0: the rule peri-variance uses); the at-init slope beside",
                            "the slope is the same size at the run's own initialisation (0.059 at init against "
                            "0.064 at the end in seed 0): an end value that initialisation already has is not "
                            "evidence about training", "held (0.0601 ± 0.0171, Holm p 0.013)",
                            hash_before="8855f15b2ceb"),)),
    Claim("cod-lns", "LayerNorm Scaling reduces the variance growth of Pre-LN",
          "Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)", "slope(Pre-LN) - slope(Pre-LN + LayerNorm "
          "Scaling), deep models (nats/block)", "> 0", "greater", ("deep_pre", "deep_lns"), "diff_slope",
          args=("deep_lns",),
          meaning="Same slope as cod-growth, Pre-LN minus Pre-LN with 1/sqrt(l) on input-norm outputs; positive = "
                  "LayerNorm Scaling grows more slowly.",
          source="paper section 4 (LayerNorm Scaling: each input-norm output times 1/sqrt(l))",
          deviations="as cod-growth."),
    Claim("peri-massive", "Peri-LN shows smaller massive activations than Pre-LN",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "log10(max_l mean top|h| / mean median|h| over sequences, "
          "Pre-LN / Peri-LN), deep models", "> 0", "greater", ("deep_pre", "deep_peri"), "massive",
          meaning="Massive activations the authors' way (Sun et al. 2024, repo locuslab/massive-activations, "
                  "main_llm.py --exp2; normlab.diagnostics.massive.per_sequence): per validation sequence the top-1 "
                  "|h| and the median |h| of a block output, each averaged over the sequences; ratio = mean top-1 / "
                  "mean median, the largest over blocks; value = log10(Pre-LN ratio / Peri-LN ratio); positive = "
                  "Peri-LN smaller. The pooled ratio (max over all sequences / pooled median) is the second number "
                  "(pooled_log10_ratio).",
          source="Peri-LN section 4 (massive activations of Pre-LN vs Peri-LN); the statistic from Sun et al. 2024, "
                 "main_llm.py --exp2 and lib/plot_utils_llm.py plot_layer_ax (np.mean over sequences)",
          deviations="sequences are the budget's validation windows of 64 bytes (theirs: 10 sequences of 4096 "
                     "tokens); the |h| > 100 criterion is never met at this scale, so the ratio is compared.",
          revised=(Revision(R1123, "statistic: top-1 / median |h| per sequence averaged over the sequences (the "
                            "authors' main_llm.py --exp2) instead of pooled over all sequences (kept as "
                            "pooled_log10_ratio)", "follow the authors' statistic", "held (+0.136)"),)),
    Claim("peri-variance", "Peri-LN keeps the hidden-state variance from growing with depth during training, where "
          "Pre-LN's grows", "Kim et al. 2025, Peri-LN (arXiv:2502.02732)",
          "change during training of the slope of ln(var) over depth: Pre-LN - Peri-LN (nats/block)", "> 0",
          "greater", ("deep_pre", "deep_peri"), "peri_variance_depth", observable="pre_slope_change",
          beside=("slope_diff_init", "growth_last_block_diff"),
          meaning="How much steeper training made the growth of the hidden-state variance with depth: per model "
                  "slope_end - slope_init of ln(variance of each block's output) against the block index on the "
                  "same validation windows (at init: the run's own seeded initialisation, rebuilt); value = "
                  "change(Pre-LN) - change(Peri-LN); positive = Pre-LN's variance grew with depth more than "
                  "Peri-LN's. The initialisation cannot dominate it: each model is compared with itself at init "
                  "(Peri-LN adds about unit variance per block at init, so its at-init slope is the larger; the "
                  "at-init difference is shown beside it, slope_diff_init). Observable at this scale only when "
                  "the phenomenon the paper explains appears: Pre-LN's own slope steepens during training "
                  "(pre_slope_change's 95% CI above 0); otherwise the verdict is 'not observable at this scale', "
                  "which is not 'not held'. Details: the growth of the last block's variance during training "
                  "(the previous metric) and the final variance relative to Pre-LN's (peri-variance-magnitude).",
          source="Peri-LN section 4 (hidden-state variance across layers and its growth over training steps: "
                 "Pre-LN's grows by orders of magnitude, Peri-LN's stays small)",
          deviations="the growth is read at two points (init and end of the 500-step run) as one log-slope over "
                     "depth, not as the paper's curves over all layers and checkpoints; 12 blocks of width 64 "
                     "instead of 400M-3.2B models.",
          revised=(Revision(R1123, "metric: ln(var_end / var_init) of the last block's output, Pre-LN - Peri-LN "
                            "(growth during training), instead of the slope of ln(var) over depth at the end",
                            "the end-of-training slope already favours Pre-LN at initialisation (Peri-LN adds "
                            "about unit variance per block)", "not held (-0.071)"),
                   Revision(R1125, "metric: change during training of the slope of ln(var) over depth, Pre-LN - "
                            "Peri-LN, with the at-init value beside it and the verdict 'not observable at this "
                            "scale' when Pre-LN's slope does not steepen",
                            "the growth of the last block's variance was dominated by Pre-LN's tiny initial "
                            "variance (about 8e-4, from N(0, 0.02) embeddings) growing to about 4.3, while Peri-LN's "
                            "final variance is 5.7x larger (peri-variance-magnitude, not held); and the 2026-11-23 "
                            "metric was chosen after seeing a 'not held', a forking path", "held (+8.17 nats)"))),
    Claim("peri-variance-magnitude", "Peri-LN's hidden states end training with a smaller variance than Pre-LN's",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "log10(var Pre-LN / var Peri-LN) of the last block's output "
          "at the end of training", "> 0", "greater", ("deep_pre", "deep_peri"), "peri_magnitude",
          meaning="The magnitude half of the Peri-LN variance claim: the variance of the residual stream after the "
                  "last block (the stream the final norm reads) on the fixed validation windows at the end of "
                  "training, Pre-LN over Peri-LN, log10; positive = Peri-LN smaller. Details: the largest variance "
                  "over the blocks of each model.",
          source="as peri-variance",
          deviations="as peri-variance; the magnitude is read at the end of the budget's run only.",
          observable="magnitude_change", beside=("magnitude_init",),
          revised=(Revision(R1127, "observability rule: judged on its end value only where training moved the "
                            "ratio in the claimed direction (magnitude_change = end - init log10 ratio, 95% CI "
                            "above 0), the rule every state claim uses; the at-init ratio beside",
                            "Peri-LN's variance is orders of magnitude above Pre-LN's at initialisation: the end "
                            "gap is read beside it", "not held (-0.75 at the end)", hash_before="5645d4feda13"),)),
    Claim("mixln-grad", "Mix-LN makes gradient norms more uniform across depth than Pre-LN",
          "Li et al. 2024, Mix-LN (arXiv:2412.13795)", "CV across blocks of per-block grad norm: Pre-LN - Mix-LN "
          "(mean over training)", "> 0", "greater", ("deep_pre", "deep_mix"), "mix",
          meaning="Per-block gradient norm sqrt(|g_attn|^2 + |g_mlp|^2 + |g_norm|^2) (normlab.names.block_grad_norms, "
                  "the report's definition too) recorded during training every diag.every "
                  "steps (before clipping); coefficient of variation (std/mean) across blocks, averaged over the "
                  "records; value = CV(Pre-LN) - CV(Mix-LN, alpha 0.25); positive = Mix-LN more uniform.",
          source="Mix-LN section 4 (gradient norms across layers) and repo pixeli99/MixLN (alpha 0.25)",
          deviations="the uniformity is summarised by one coefficient of variation; 12 blocks of width 64.",
          revised=(Revision("2026-11-24", "measure: the per-block gradient norm includes the norm-site parameters "
                            "(normlab.names.block_grad_norms, the report's definition; commit 5c68437)",
                            "one definition shared with the report", "held (0.7906; 0.7767 after)"),)),
    Claim("postln-warmup", "Deep Post-LN without warm-up trains worse (or diverges) where Pre-LN does not",
          "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (arXiv:2002.04745)",
          "collapse rate per model (Clopper-Pearson) and val bpb(Post-LN) - bpb(Pre-LN) over the seeds where neither "
          "collapsed, deep, no LR warm-up", "> 0", "greater",
          ("deep_post_nowarm", "deep_pre_nowarm"), "collapse_diff", args=("deep_post_nowarm", "deep_pre_nowarm"),
          test="collapse", practical_margin=BPB_MARGIN,
          meaning="Both deep models trained with train.warmup_steps=0 at the same peak LR. The outcome splits: a "
                  "run collapses (diverges, or ends at or above the unigram entropy of the training bytes minus "
                  "0.1 bits/byte, i.e. learns nothing beyond byte frequencies: normlab.stats.learning, the rule of "
                  "the report) or trains. Reported per model: the collapse "
                  "rate with its exact Clopper-Pearson 95% interval, and the final validation bits/byte difference "
                  "over the seeds where neither run collapsed (a t interval over a bimodal outcome is the wrong "
                  "tool). Held when Post-LN's collapse interval lies above Pre-LN's, or the difference given no "
                  "collapse is decided positive; not held when it is decided negative and the collapse rates are "
                  "not separated.",
          source="paper section 3 (Post-LN needs the warm-up stage; Pre-LN trains without it)",
          deviations="AdamW at the budget's peak LR 3e-3 (the paper: Adam on translation / BERT); 12 blocks.",
          revised=(Revision(R1125, "test: collapse rate per model (Clopper-Pearson) and the loss difference given no "
                            "collapse, instead of a t interval of the bits/byte difference with a diverged run "
                            "scored 8 bits/byte", "the outcome is bimodal: without warm-up Post-LN was better in 4 "
                            "of 5 seeds and one seed collapsed (4.49 bits/byte)", "inconclusive (-0.35 ± 0.99)"),
                   Revision(R1127, "collapse rule: diverged, or at or above the unigram bits/byte minus 0.1 "
                            "(normlab.stats.learning, the report's did-not-learn rule), instead of minus 0.5; "
                            "stored runs re-judged from their recorded bits/byte",
                            "one collapse rule with one threshold on every path (the demo used 0.1, this claim 0.5); "
                            "under 0.5 a Post-LN seed at 4.55 bits/byte, 0.12 below the unigram level, counted as "
                            "collapsed", "inconclusive (-0.6873 ± 0.4009 over 4 seeds; collapse 1/5 vs 0/5)",
                            "154be12c8df6"))),
    Claim("dyt-vs-ln", "DyT (the authors' LLaMA recipe) reaches the loss of LayerNorm within a small margin",
          "Zhu et al. 2025, Transformers without Normalization (arXiv:2503.10622)", "best-of-grid val bpb(DyT) - "
          "best-of-grid bpb(LayerNorm), Pre placement, untied LM head", "|Δ| < 0.05", "within",
          ("grid_ln_untied", "grid_dyt"), "best_diff", args=("grid_dyt", "grid_ln_untied"), margin=0.05,
          meaning="Equivalence test: held when bpb(DyT) - bpb(LN) is decided inside ±0.05 bits/byte (two one-sided "
                  "tests, Holm-adjusted with the family), not held when decided outside. Each model at its own "
                  "best learning rate of the budget's grid (the authors tune the learning rate per model), best "
                  "final validation bits/byte per seed. DyT with the authors' LLaMA recipe: untied LM head, no "
                  "DyT bias, alpha0 0.8 (attention input) / 0.2 (MLP input) / 0.2 (final): the authors' values for "
                  "their width class closest to ours (LLaMA 7B, d = 4096; 13B uses 0.6 / 0.15, 34B and 70B 0.2 / "
                  "0.05), a learnable scalar after the token embedding; the LayerNorm baseline has the same untied "
                  "head.",
          source="paper section 5 (LLaMA 7B-70B) and the authors' script jiachenzhu/DyT other_tasks/LLaMA "
                 "(fms_fsdp/models/llama.py: tie_heads False, LayerNormParameterized = weight * tanh(alpha x) "
                 "without bias, shared_scale init sqrt(emb_dim); README: attn/ffn/dec alpha 0.8/0.2/0.2 for 7B)",
          deviations="the embedding scalar starts at sqrt(4096) = 64 (their d), not sqrt(64) = 8: with N(0, 0.02) "
                     "embeddings that starts the stream at RMS 1.28 as in their 7B, where sqrt(d) at d = 64 would "
                     "start it at 0.16 (docs/norms.md measures that variant far worse); alpha inits of their smallest "
                     "model (7B; smaller than theirs, ours might want larger); GELU MLP and LayerNorm baseline "
                     "instead of SwiGLU and RMSNorm; the grid's depth and steps (full: 6 blocks, 200 steps) and its "
                     "learning rates 1e-3 .. 0.3 instead of their tuned 7B schedule. What that budget does to "
                     "DyT: in the full run of 2026-11-26 its best-of-grid loss (4.34-4.74 bits/byte) stayed above "
                     "the collapse level (unigram entropy 4.67 minus 0.5) in every seed, LayerNorm's at 3.40-3.54: "
                     "at 200 steps DyT learned little beyond byte frequencies at any grid rate: in 3 of 5 seeds it "
                     "did not learn at all (within 0.1 of the unigram bits/byte), and in the 2 where it did it "
                     "ended 0.86 and 0.94 bits/byte behind LayerNorm. 'Not held' is a finding about this budget: "
                     "DyT with this recipe does not train in 200 steps; it says nothing about the loss it converges "
                     "to.",
          revised=(Revision(R1123, "recipe: the authors' LLaMA recipe (untied head, no bias, alpha0 0.8/0.2/0.2, "
                            "embedding scalar) against LayerNorm with the same untied head, instead of DyT with "
                            "the suite's defaults against the tied LayerNorm model", "follow the authors' recipe",
                            "not held (+1.07 ± 0.27)"),
                   Revision(R1125, "recipe: each model at its own best learning rate of the grid, instead of both at "
                            "the budget's 3e-3 (10x the authors' 3e-4)", "one learning rate 10x the authors' with "
                            "per-seed gaps of 0.36 to 1.63 points to instability, not capacity; the authors tune "
                            "the learning rate per model", "not held (+0.89 ± 0.58)")),
          must_learn=("best_grid_dyt", "best_grid_ln_untied")),
    Claim("lssar-extrapolation", "Softplus attention with re-weighting keeps loss flatter than softmax up to 16x the "
          "training length",
          "Gao, Spratling & Gionfrida 2025, Softplus Attention with Re-weighting (arXiv:2501.13428; repo "
          "iminfine/freeattn)",
          "loss(16x) - loss(1x) [nats/token]: softmax - softplus+LSSAR (trained with re-weighting)", "> 0",
          "greater", ("ln", "softplus_lssar"), "extrap",
          meaning="Both models trained at the same context with RoPE, the softplus model with LSSAR re-weighting "
                  "on during training (model.lssa_reweight=true), as the paper trains it; evaluated on the same "
                  "validation tokens with non-overlapping windows of 1x..16x the training context "
                  "(normlab.eval.extrapolation). Value = softmax degradation minus softplus+LSSAR degradation; "
                  "positive = flatter with LSSAR. The eval-only switch is measured separately (lssar-eval-only).",
          source="paper section 3-4 (LSSA with re-weighting, power 15; length extrapolation to 16x) and repo "
                 "iminfine/freeattn",
          deviations="trained at context 64 and evaluated to 1,024 (theirs: GPT-2-size models on longer "
                     "contexts); the repo could not be fetched here, the formulas follow docs/attention.md.",
          revised=(Revision(R1123, "recipe: the softplus model trained with LSSAR re-weighting on, instead of "
                            "re-weighting switched on only at evaluation (kept as lssar-eval-only)",
                            "the paper trains with re-weighting", "inconclusive (-0.028)"),)),
    Claim("lssar-eval-only", "Softplus attention trained without re-weighting, with LSSAR switched on only at "
          "evaluation, keeps loss flatter than softmax up to 16x",
          "Gao, Spratling & Gionfrida 2025, Softplus Attention with Re-weighting (arXiv:2501.13428; repo "
          "iminfine/freeattn)",
          "loss(16x) - loss(1x) [nats/token]: softmax - softplus with LSSAR at evaluation only", "> 0", "greater",
          ("ln", "softplus"), "extrap_eval_only",
          meaning="The earlier measurement, kept as a separate, labelled one: the softplus model trained without "
                  "re-weighting and evaluated with model.lssa_reweight=true (no fine-tuning), as lssar-extrapolation "
                  "otherwise. The switch raises the 1x loss of a model never trained with it; details give the "
                  "softplus model without re-weighting too.",
          source="as lssar-extrapolation",
          deviations="not the paper's protocol (it trains with re-weighting): a measurement of what the switch "
                     "alone does."),
    Claim("powernorm-lm", "PowerNorm gives lower loss than LayerNorm on language modelling",
          "Shen et al. 2020, PowerNorm (arXiv:2003.07845)", "val bpb(LayerNorm) - bpb(PowerNorm)", "> 0", "greater",
          ("ln", "powernorm"), "bpb_diff", args=("ln", "powernorm"),
          meaning="Final validation bits/byte; positive = PowerNorm better (the paper reports lower perplexity). "
                  "PowerNorm as the authors' transformer uses it: group scaling with groups = attention heads (4), "
                  "statistics warm-up = the LR warm-up.",
          source="paper section 5 (Wikitext-103 / PTB language modelling) and repo sIncerass/powernorm "
                 "(fairseq/modules/norm_select.py: MaskPowerNorm(embed_dim, group_num=head_num); "
                 "norms/mask_powernorm.py)",
          deviations="Pre-LN placement (the suite's baseline) and the budget's warm-up 50 steps as the statistics "
                     "warm-up (their NormSelect default 1000 updates); byte-level pystdlib instead of word-level "
                     "Wikitext-103 / PTB.",
          practical_margin=BPB_MARGIN,
          revised=(Revision(R1123, "recipe: PowerNorm statistics grouped per attention head (groups = heads, the "
                            "authors' transformer) instead of over the whole width", "follow the authors' recipe",
                            "not held (-0.042 ± 0.035)"),
                   Revision(R1125, f"practical margin {BPB_MARGIN} bits/byte", MARGIN_WHY,
                            "inconclusive (-0.035 ± 0.063)"))),
    Claim("linear-attention", "Causal linear attention with division normalisation and LINA's input conv is "
          "competitive with softmax at equal parameters", "Wang et al. 2026, LINA",
          "bpb(linear+conv) / bpb(softmax) - 1", "< 0.05", "less", ("ln", "linear_conv"), "linear", null=0.05,
          meaning="Linear attention (relu kernel, division normalisation, causal prefix sums) with LINA's locality "
                  "branch, a causal depthwise conv of size 4 of the attention input (model.linear_conv_source: "
                  "input), vs softmax at the same width/depth (the conv adds 5 x width parameters per block, "
                  "reported); competitive = relative bpb gap below 5%: held when the CI's upper end is below 0.05, "
                  "not held when its lower end is above.",
          source="LINA, repo techmonsterwang/LINA (diffnext/models/vision_transformer_linear_decouple1_kvscale1.py "
                 "LinearAttentionDecoder: dw_conv = Conv2d(dim, dim, 5, groups=dim) of the attention input x, "
                 "added to the attention output before proj)",
          deviations="their vision code is bidirectional with a 5x5 2-D conv; here causal prefix sums and a causal "
                     "1-D conv of size 4 (a causal LM); no KV gate.",
          revised=(Revision(R1123, "recipe: LINA's locality branch convolves the attention input "
                            "(model.linear_conv_source: input) instead of the values (NaLaFormer's branch)",
                            "follow LINA", "held (-0.017)"),)),
    # operating on trained models (normlab.surgery, docs/surgery.md; measures_surgery.py)
    Claim("ln-removal", "LayerNorm can be removed by fine-tuning at a small loss increase",
          "Heimersheim 2024 (arXiv:2409.13710); Baroni et al. 2025 (arXiv:2507.02559): +0.03 nats for GPT-2 XL",
          "val loss of the LN-free model - LN model fine-tuned for the same steps (nats/token)", "< 0.05",
          "less", ("ln",), "removal", null=0.05,
          meaning="normlab remove-norm on each seed's Pre-LN run (group schedule: MLP-input norms, attention-input "
                  "norms, final norm; each site's scale from the average per-token std on training windows; "
                  "fine-tuning steps per stage per budget: tiny 2, quick 10, full 30; lr = budget lr / 10), "
                  "against the control: the same LayerNorm model fine-tuned alike for 3x the steps. Positive = "
                  "removal costs loss. 'Small' is taken as below 0.05 nats/token; the paper's GPT-2 XL number "
                  "is +0.03."),
    Claim("hadamard-w4", "A randomized Hadamard rotation of the residual stream reduces the 4-bit quantization "
          "loss", "Ashkboos et al. 2024, QuaRot (arXiv:2404.00456)",
          "Δbpb(W4 RTN) - Δbpb(W4 RTN after Hadamard rotation), Pre-LN (bits/byte)", "> 0", "greater", ("ln",),
          "hadamard",
          meaning="Simulated W4 round-to-nearest, symmetric, per output channel, on every linear inside the "
                  "blocks (embeddings and head in fp32); the rotated model is the exact Pre-RMSNorm conversion "
                  "with a randomized Hadamard rotation fused into the weights (checked to 1e-4 before "
                  "quantization). Positive = the rotation lowers the bits/byte increase.",
          practical_margin=BPB_MARGIN,
          revised=(Revision(R1125, f"practical margin {BPB_MARGIN} bits/byte", MARGIN_WHY,
                            "inconclusive (-2.5e-05 ± 0.0088)"),)),
    Claim("peri-quant", "Peri-LN (smaller massive activations) loses less under 4-bit quantization than Pre-LN",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732); Sun et al. 2024, Massive Activations",
          "Δbpb(W4 RTN) of Pre-LN - of Peri-LN, deep models (bits/byte)", "> 0", "greater",
          ("deep_pre", "deep_peri"), "peri_quant",
          meaning="Same W4 RTN as hadamard-w4, no rotation, on the deep Pre-LN and Peri-LN runs of "
                  "peri-massive. Positive = Peri-LN loses less.",
          practical_margin=BPB_MARGIN,
          revised=(Revision(R1125, f"practical margin {BPB_MARGIN} bits/byte", MARGIN_WHY + " (here 0.006 "
                            "bits/byte with 3 of 5 per-seed deltas of Peri-LN negative)", "held (+0.0063 ± 0.0058)"),)),
    Claim("mano-rank", "The label-free MaNo score ranks runs like their loss (higher MaNo, lower loss)",
          "Xie et al. 2024, MaNo (NeurIPS 2024, arXiv:2405.18979)",
          "Spearman rho(MaNo, val loss) over the runs of one seed", "< 0", "less", RANK_VARIANTS, "rank",
          args=("mano",),
          meaning="Per seed, MaNo (softmax-normalised logits, p = 4) and the loss on the same validation tokens "
                  "for the runs " + ", ".join(RANK_VARIANTS) + "; value = Spearman rank correlation; -1 = "
                  "the same ranking as the loss."),
    Claim("mnn-rank", "The Matrix Nuclear-Norm ranks runs like their loss (lower MNN, lower loss)",
          "Li et al. 2024, Matrix Nuclear-Norm (arXiv:2410.10672)",
          "Spearman rho(MNN, val loss) over the runs of one seed", "> 0", "greater", RANK_VARIANTS,
          "rank", args=("matrix_nuclear_norm",),
          meaning="As mano-rank with the Matrix Nuclear-Norm of the LM head's input hidden states (authors' "
                  "code: column-centred, row-normalised, sum of the largest column norms / T). The expected "
                  "sign follows the paper's reading (lower = better compression)."),
    # learning-rate sweep claims (Wortsman et al. 2023; measures_lr.py)
    Claim("qk-lr-sensitivity", "QK-norm lowers the learning-rate sensitivity of Pre-LN", WORTSMAN,
          "LR sensitivity(Pre-LN) - LR sensitivity(Pre-LN + QK-norm), bits/byte", "> 0", "greater",
          ("grid_pre", "grid_pre_qk"), "sens_diff", args=("grid_pre", "grid_pre_qk"),
          meaning=LR_SENSITIVITY + " QK-norm: RMSNorm on queries and keys per head (model.qk_norm). Positive = "
                                   "QK-norm less sensitive (the paper's attention-logit-growth fix). On a second "
                                   "corpus the replication was underpowered: the demo's declared replication on "
                                   "English text (docs/compare.md, 4 seeds, Holm over its family of 3) estimated "
                                   "the same difference, -0.279 ± 0.390 bits/byte, undecided (Holm p 0.215), "
                                   "against -0.281 ± 0.087 on pystdlib; its power to detect that effect at Holm's "
                                   "first level 0.05/3 was 0.15, so it neither confirms nor contradicts it: a "
                                   "verdict here is shown for Python source only."),
    Claim("zloss-logit-divergence", "z-loss keeps the output logits from diverging at a high learning rate", WORTSMAN,
          "|mean logsumexp(logits)| at the end, highest grid lr: Pre-LN - Pre-LN + z-loss 1e-4", "> 0", "greater",
          ("grid_pre", "grid_pre_z"), "zloss",
          meaning="Output logit divergence (paper section 3.2): log Z = logsumexp of the output logits drifts "
                  "away from 0; the z-loss 1e-4 log^2 Z (train.z_loss) holds it near 0. Value: |log Z| of "
                  "Pre-LN minus that of Pre-LN + z-loss, mean over positions at the last diagnostic step of "
                  "the run at the highest learning rate of the grid. Positive = z-loss keeps log Z nearer 0."),
    Claim("warmup-lr-sensitivity", "Learning-rate warm-up lowers the learning-rate sensitivity", WORTSMAN,
          "LR sensitivity(Pre-LN, no warm-up) - LR sensitivity(Pre-LN, warm-up 10% of steps), bits/byte", "> 0",
          "greater", ("grid_pre_nowarm", "grid_pre"), "sens_diff", args=("grid_pre_nowarm", "grid_pre"),
          meaning=LR_SENSITIVITY + " Warm-up: linear over the first 10% of the steps (train.warmup_steps) vs none."),
    Claim("postln-lr-sensitivity", "Post-LN is more sensitive to the learning rate than Pre-LN",
          "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (arXiv:2002.04745)",
          "LR sensitivity(Post-LN) - LR sensitivity(Pre-LN), bits/byte", "> 0", "greater",
          ("grid_post", "grid_pre"), "sens_diff", args=("grid_post", "grid_pre"),
          meaning=LR_SENSITIVITY + " The Post-LN vs Pre-LN claim re-measured over a learning-rate grid instead of one "
                                   "learning rate without warm-up (postln-warmup). The collapse table per learning "
                                   "rate (a run that diverged or ended within 0.1 bits/byte of the unigram level "
                                   "or above it: normlab.stats.learning) "
                                   "shows how much of the sensitivity is collapse rather than a graded loss "
                                   "difference: a sensitivity driven by collapses says Post-LN's stable range is "
                                   "narrower, not that it trains worse where it trains."),
    Claim("peri-lr-sensitivity", "Peri-LN is less sensitive to the learning rate than Pre-LN",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "LR sensitivity(Pre-LN) - LR sensitivity(Peri-LN), "
          "bits/byte", "> 0", "greater", ("grid_pre", "grid_peri"), "sens_diff", args=("grid_pre", "grid_peri"),
          meaning=LR_SENSITIVITY + " Peri-LN normalises each sublayer's input and output; the paper reports more "
                                   "stable training across learning rates. The demo's declared replication on "
                                   "English text (docs/compare.md, 4 seeds, Holm over its family of 3) decided it "
                                   "there too: -0.430 ± 0.189 bits/byte, Holm p 0.0165."),
    Claim("mixln-lr-best", "Mix-LN reaches a lower best-of-grid loss than Pre-LN",
          "Li et al. 2024, Mix-LN (arXiv:2412.13795)", "L*(Pre-LN) - L*(Mix-LN): best final validation bits/byte "
          "over the learning-rate grid", "> 0", "greater", ("grid_pre", "grid_mix"),
          "best_diff", args=("grid_pre", "grid_mix"),
          meaning="Best final validation bits/byte over the grid per seed (each variant at its own best learning "
                  "rate), Pre-LN minus Mix-LN (alpha 0.25: Post-LN in the first quarter of the blocks). "
                  "Positive = Mix-LN better, as the paper reports.",
          practical_margin=BPB_MARGIN,
          revised=(Revision(R1125, f"practical margin {BPB_MARGIN} bits/byte", MARGIN_WHY,
                            "inconclusive (-0.028 ± 0.051)"),),
          must_learn=("best_grid_pre", "best_grid_mix")),
    # techniques from the seed literature (measures_literature.py)
    Claim("adagc-lr-sensitivity", "AdaGC lowers the learning-rate sensitivity of Pre-LN compared with global "
          "gradient clipping", "Wang et al. 2025, AdaGC (arXiv:2502.11034)",
          "LR sensitivity(Pre-LN, global clipping 1.0) - LR sensitivity(Pre-LN, AdaGC), bits/byte", "> 0", "greater",
          ("grid_pre", "grid_pre_adagc"), "sens_diff", args=("grid_pre", "grid_pre_adagc"),
          meaning=LR_SENSITIVITY + " AdaGC (train.clip: adagc): every parameter tensor clipped to 1.05 x an EMA "
                                   "(0.98) of its own clipped gradient norm, global clipping at 1.0 during the "
                                   "warm-up. Positive = AdaGC less sensitive.",
          source="paper section 3 (the AdaGC update; lambda_rel 1.05, beta 0.98) and its loss-spike experiments",
          deviations="the warm-up of global clipping is the learning-rate warm-up (10% of the grid's steps) "
                     "instead of the paper's fixed count of steps; 6-block models for the grid's steps instead of "
                     "7B-13B LLMs."),
    Claim("adagc-spikes", "AdaGC has fewer loss spikes than global gradient clipping",
          "Wang et al. 2025, AdaGC (arXiv:2502.11034)",
          "loss spikes summed over the learning-rate grid: Pre-LN (global clipping) - Pre-LN + AdaGC", "> 0",
          "greater", ("grid_pre", "grid_pre_adagc"), "spike_diff", args=("grid_pre", "grid_pre_adagc"),
          meaning="Loss spikes as the training loop counts them (a step whose loss exceeds 2x the mean of the "
                  "previous 20; summary.json loss_spikes), summed over the runs of the grid of one seed. "
                  "Positive = fewer spikes with AdaGC.",
          source="paper section 4 (loss spikes of global clipping vs AdaGC)",
          deviations="as adagc-lr-sensitivity; the paper's spike score is not reproduced, the loop's spike count "
                     "stands in for it."),
    Claim("stablemax-collapse", "With StableMax the Softmax-Collapse fraction stays at zero where softmax collapses",
          "Prieto et al. 2025, Grokking at the Edge of Numerical Stability (arXiv:2501.04697)",
          "fraction of positions in Softmax Collapse (fp32 target probability exactly 1) at the last diagnostic step, "
          "highest grid lr: softmax - StableMax", "> 0", "greater", ("grid_pre", "grid_pre_stablemax"), "collapse",
          meaning="diag/softmax_collapse (normlab.diagnostics.collapse) of Pre-LN with softmax output and with "
                  "model.output: stablemax at the grid's highest learning rate. Positive = softmax collapses "
                  "more. Details give the largest fraction over the grid.",
          source="paper section 3 (Softmax Collapse) and section 5 (StableMax)",
          deviations="a byte-level language model at learning rates up to the grid's highest, not the paper's "
                     "algorithmic tasks trained for 10^4-10^5 steps past memorisation; a model that never becomes "
                     "confident enough cannot collapse, and then both fractions are 0.",
          observable="collapse_softmax",
          revised=(Revision(R1126, "observability rule: softmax's collapse fraction (collapse_softmax) must have a "
                            "95% CI above 0, else 'not observable at this scale'", ABSENT_WHY,
                            "inconclusive (0.0000 ± 0.0000, every seed 0)", "2830f83d8fb3"),)),
    Claim("tev-instability", "Token Embedding Variability is larger where Pre-LN training is unstable",
          "Chung et al. 2024, Stable Language Model Pre-training by Reducing Embedding Variability "
          "(arXiv:2409.07787)", "TEV (mean over the vocabulary) at the last diagnostic step: highest grid lr - best "
          "lr, Pre-LN", "> 0", "greater", ("grid_pre",), "tev",
          meaning="diag/tev_mean (normlab.diagnostics.weightnorms) of Pre-LN at the grid's highest learning rate "
                  "minus at its best learning rate (lowest final loss). Positive = the unstable end of the grid has "
                  "the more variable embeddings, as the paper's proxy says. Details give TEV at every lr.",
          source="paper section 2 (TEV as a proxy for the gradient variance of Pre-LN models)",
          deviations="TEV compared across learning rates at the end of short runs, not tracked before loss spikes "
                     "of GPT-2 pre-training."),
    Claim("transnormer-vs-linear", "NormAttention (a norm after the attention, no denominator) trains to a lower "
          "loss than division-normalised linear attention", "Qin et al. 2022, The Devil in Linear Transformer "
          "(TransNormer, arXiv:2210.10340)", "val bpb(linear) - bpb(transnormer)", "> 0", "greater",
          ("linear", "transnormer"), "bpb_diff", args=("linear", "transnormer"),
          meaning="Both with RoPE in a Pre-LN 4-block model: model.attention: linear (relu kernel, division by "
                  "phi(q).z) vs transnormer (1 + elu kernel, no denominator, SRMSNorm on the output). Positive = "
                  "NormAttention better.",
          source="paper section 3 (NormAttention) and its language-modelling results against linear transformers",
          deviations="every block uses NormAttention (TransNormer's diagonal softmax attention in the lower layers is "
                     "not built), no output gate; byte-level pystdlib instead of WikiText-103."),
    Claim("residual-sink-clipping", "Clipping the residual sinks to the median scale hurts more than clipping as "
          "many other dimensions", "Qiu et al. 2026, A Unified View of Attention and Residual Sinks "
          "(arXiv:2601.22966)", "loss increase (nats/token) with the sink dims clipped - with as many other dims "
          "clipped, deep Pre-LN", "> 0", "greater", ("deep_pre",), "residual_sinks",
          meaning="Residual sinks by normlab.diagnostics.residual_sinks (dims above 10x the block's median |h| on "
                  ">= 50% of tokens) on the validation sample; all blocks' sink dims clamped to [-median, median] "
                  "at the block outputs vs the same for as many random non-sink dims. Positive = the model relies "
                  "on its outliers (outlier-driven rescaling). 0 when no sink is found.",
          source="paper section 4 (clipping outliers while keeping the normalization degrades the model)",
          deviations="clipping at evaluation of a trained model instead of during training; a stated detection "
                     "criterion instead of the paper's reading of activation plots.",
          observable="max_rms_share",
          revised=(Revision(R1126, "observability rule: the sink dims' share of the residual RMS (max_rms_share, 0 "
                            "when no sink is found) must have a 95% CI above 0, else 'not observable at this scale'",
                            ABSENT_WHY, "inconclusive (0.0000 ± 0.0000, no sink in any seed)", "827d26c74c2f"),)),
    Claim("higgs-w3", "The HIGGS grid (Hadamard + Gaussian MSE-optimal levels) loses less than round-to-nearest "
          "at 3 bits", "Malinovskii et al. 2024, HIGGS (arXiv:2411.17525)",
          "Δbpb(W3 RTN) - Δbpb(W3 HIGGS), Pre-LN (bits/byte)", "> 0", "greater", ("ln",), "quant_diff",
          args=(3, "higgs"),
          meaning="normlab quantize --weights 3 vs --weights 3 --grid higgs on each seed's Pre-LN run (every linear "
                  "inside the blocks; embeddings and head fp32). Positive = HIGGS loses less.",
          source="paper section 4 (HIGGS grids; data-free quantization results)",
          deviations="scalar Lloyd-Max grids only (no vector grids), group RMS as the scale, simulated (fake-quant)."),
    Claim("norm-tweak-w3", "Norm Tweaking reduces the loss increase of 3-bit weight quantization",
          "Li et al. 2024, Norm Tweaking (AAAI 2024, arXiv:2309.02784)",
          "Δbpb(W3 RTN) - Δbpb(W3 RTN + Norm Tweaking), Pre-LN (bits/byte)", "> 0", "greater", ("ln",),
          "quant_diff", args=(3, "tweak"),
          meaning="normlab quantize --weights 3 vs --weights 3 --norm-tweak (32 training-split windows, Adam lr "
                  "1e-3, one pass). Positive = Norm Tweaking recovers loss. Details give the output error on the "
                  "calibration and held-out windows.",
          source="paper section 3 (Algorithm 1, the channel-wise distribution loss)",
          deviations="training-split windows instead of self-generated calibration data; RTN instead of GPTQ "
                     "underneath; learning rate for small models."),
    Claim("linearity-w4", "The linearity theorem predicts the 4-bit loss increase within a factor of 2",
          "Malinovskii et al. 2024, HIGGS (arXiv:2411.17525)",
          "log2(predicted / measured Δbpb), W4 RTN, Pre-LN", "|Δ| < 1", "within", ("ln",), "linearity", args=(4,),
          margin=1.0,
          meaning="Per-layer coefficients a_l from Gaussian noise of relative squared error 0.01 on one layer at a "
                  "time; predicted Δbpb = sum_l a_l t_l with t_l the W4 RTN relative errors; held when the CI of "
                  "log2(predicted/measured) lies inside (-1, 1).",
          source="paper section 3 (Theorem 1 and its calibration of the coefficients by noise)",
          deviations="one noise draw per layer; bits/byte on validation tokens instead of perplexity."),
]
CLAIM_NAMES = [c.name for c in CLAIMS]


def select(only: str | None) -> list[Claim]:
    """The claims named in ``only`` (comma-separated; all when empty), in the suite's order."""
    if not only:
        return list(CLAIMS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise NormlabError(f"--only needs at least one claim name, got '{only}'; allowed: {', '.join(CLAIM_NAMES)}")
    for n in names:
        if n not in CLAIM_NAMES:
            from normlab.errors import did_you_mean

            raise NormlabError(f"unknown claim '{n}'{did_you_mean(n, CLAIM_NAMES)}; allowed: {', '.join(CLAIM_NAMES)}")
    return [c for c in CLAIMS if c.name in names]


def grid_claim_names() -> set[str]:
    """The claims measured over the learning-rate grid."""
    from normlab.experiments.claims.variants import GRID_VARIANTS

    return {c.name for c in CLAIMS if any(v in GRID_VARIANTS for v in c.variants)}
