"""The package version, in a module of its own so any floor can read it without importing the package face."""

__version__ = "0.1.0"
