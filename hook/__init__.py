"""oci-device-hook; ``__version__`` stamps every cache record (a record of another version is a miss)."""

__version__ = "0.1.0"
