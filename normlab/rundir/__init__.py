"""The run directory, the one owner of what a normlab run leaves on disk (docs/architecture.md).

- ``files``: every file name of a run directory, defined once;
- ``rundir``: reading a run (summary, metrics, config, data and tokenizer identity, ``load_run``, ``open_run``);
- ``tensors``: safetensors files (``save_tensors`` / ``load_tensors``, the final weights, checkpoints);
- ``fingerprint``: what determines a run's numbers;
- ``publish``: ``publish_run``, the one writer of a finished run directory (train, convert, quantize, remove-norm,
  import).

Above model/data/config, below train, eval, convert, surgery, interop and experiments. Importing the package, its
file names or its readers does not import torch.
"""
