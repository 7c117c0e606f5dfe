"""mtrain: train, decode and evaluate Transformer translation models from one CLI."""

__version__ = "0.1.0"


def installed_version() -> str:
    """What `mtrain --version` prints: the version pip installed (the package's metadata), or
    __version__ when mtrain runs from a checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mtrain")
    except PackageNotFoundError:
        return __version__
