"""``CustomOpBuilder`` under its old home: the class is defined in ``opbuilder/__init__.py`` (one module
less for every new process to import, issue 35)."""
from . import CustomOpBuilder

__all__ = ["CustomOpBuilder"]
