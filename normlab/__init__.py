"""normlab: a lab for normalization in transformer language models."""

__version__ = "0.1.0"
