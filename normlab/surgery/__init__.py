"""Model surgery on trained runs (docs/surgery.md):

- ``remove_norm``: LayerNorm / RMSNorm removal by fine-tuning (Heimersheim 2024; Baroni et al. 2025);
- ``quantize`` / ``rotate`` / ``run_quantize``: simulated RTN quantization, QuaRot-style Hadamard rotation
  (Ashkboos et al. 2024) on top of the exact conversions of normlab.convert;
- ``label_free``: MaNo (Xie et al. 2024) and Matrix Nuclear-Norm (Li et al. 2024) scores;
- ``robustness``: the per-run measurements behind ``normlab report --quantize --label-free`` (whose columns and
  section are normlab.report.surgery_columns) and the surgery claims.

Upper layer: imports norms / model / convert / train / eval, and nothing imports it from below.
"""
