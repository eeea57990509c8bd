"""Diagnostics: why normalization choices differ (docs/diagnostics.md).

- :mod:`.training`: cheap per-block statistics during training (``diag`` config section) and loss spikes;
- post-hoc analyses on a fixed sample of sequences, combined by :func:`.analyze.diagnose_model`:
  :mod:`.depth` (variance growth with depth), :mod:`.massive` (massive activations), :mod:`.sinks` (attention
  sinks; :func:`.sinks.attention_probs` is the attention-probability API), :mod:`.effectiveness` (angular
  distance, skip cost), :mod:`.normstats` (norm parameter statistics);
- :mod:`.plots`: PNGs (imports matplotlib lazily).

Importing this package does not import matplotlib or the training loop.
"""

from normlab.diagnostics.analyze import diagnose_model, sample_sequences, training_records
from normlab.diagnostics.depth import log_slope, variance_by_depth
from normlab.diagnostics.effectiveness import angular_distance, angular_distances, skip_losses
from normlab.diagnostics.massive import massive_activations, massive_by_block
from normlab.diagnostics.normstats import norm_parameter_stats
from normlab.diagnostics.sinks import AttentionUnavailable, attention_probs, sink_analysis, sink_stats, token_importance
from normlab.diagnostics.training import SpikeDetector, TrainDiagnostics, detect_spikes, grad_norms

__all__ = [
    "AttentionUnavailable", "SpikeDetector", "TrainDiagnostics", "angular_distance", "angular_distances",
    "attention_probs", "detect_spikes", "diagnose_model", "grad_norms", "log_slope", "massive_activations",
    "massive_by_block", "norm_parameter_stats", "sample_sequences", "sink_analysis", "sink_stats",
    "skip_losses", "token_importance", "training_records", "variance_by_depth",
]
