"""The version of hvd-magic, in one place: pyproject.toml reads it (without importing the
core), ``engine_native.__version__`` and ``hvd_magic.__version__`` are this string."""

__version__ = "0.1.0"
