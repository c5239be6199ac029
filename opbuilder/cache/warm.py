"""The warm record's check, ``opbuilder.warm`` (opbuilder/warm.py), under its old name: importing this
module gives that one (the same module object, so what is set on one is set on the other)."""
import sys

from .. import warm as _warm

sys.modules[__name__] = _warm
