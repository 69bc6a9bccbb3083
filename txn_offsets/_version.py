"""The installed distribution's version (the package root and the CLI's --version show it)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("txn-offsets")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"
