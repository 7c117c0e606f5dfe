"""mtrain: train, decode and evaluate Transformer translation models from one CLI."""

import os

__version__ = "0.1.0"

# oneDNN (torch's CPU bf16 matrix products) keeps up to 1,024 compiled primitives, each with
# its buffers, one per operation and batch shape: over the varying shapes of a training run
# that held ~0.6 GB on the CPU benchmark (bf16 peak RSS 1,265 -> 1,014 MB with 16, speed
# within noise; docs/PERFORMANCE.md). Read when oneDNN builds its first primitive, so set
# here, before any training; a value the user set wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")


def installed_version() -> str:
    """What `mtrain --version` prints: the version pip installed (the package's metadata), or
    __version__ when mtrain runs from a checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mtrain")
    except PackageNotFoundError:
        return __version__
