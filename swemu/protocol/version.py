"""The package version, in the base layer so that every layer can report it."""

__version__ = "0.1.0"
