"""``opbuilder.to_torch`` and ``to_jax`` where torch or JAX is not installed: a ModuleNotFoundError that
names the pip extra to install (the name stays the missing package's, as Python's own error has it)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a child where importing torch or jax fails as when neither is installed
CHILD = r'''
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "jax", "jaxlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
import opbuilder
for how in ("attribute", "from-import"):
    try:
        if how == "attribute":
            getattr(opbuilder, NAME)
        else:
            exec(f"from opbuilder import {NAME}")
    except ModuleNotFoundError as e:
        print(type(e).__name__, e.name, e, sep="|")
'''


@pytest.mark.parametrize("name, extra", [("to_torch", "torch"), ("to_jax", "jax")])
def test_a_bridge_without_its_package_names_the_extra(name, extra):
    r = subprocess.run([sys.executable, "-c", CHILD.replace("NAME", repr(name))], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = (f"ModuleNotFoundError|{extra}|opbuilder.{name} needs {extra}, which is not installed: "
            f"python -m pip install 'opbuilder[{extra}]'")
    assert r.stdout.splitlines() == [line, line]
