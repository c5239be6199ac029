"""The precompiled opbuilder/extension.h: built once per toolchain and flags, used only
where forcing it first cannot change a source's meaning, and accepted by the compiler."""
import pytest

from opbuilder import pch


@pytest.mark.parametrize("text, expected", [
    ('#include "opbuilder/extension.h"\n', True),
    ('// a comment\n/* a\n block */\n#include <vector>\n#include <string>\n\n#include "opbuilder/extension.h"\n', True),
    ('#include <opbuilder/extension.h>\n', True),
    ('#include <stdexcept>\n#  include "ms_extension.h"\n', True),
    ('#define PYBIND11_DETAILED_ERROR_MESSAGES\n#include "opbuilder/extension.h"\n', False),
    ('#include "my_config.h"\n#include "opbuilder/extension.h"\n', False),
    ('#ifdef FAST\n#include "opbuilder/extension.h"\n#endif\n', False),
    ('#include <pybind11/pybind11.h>\nPYBIND11_MODULE(x, m) {}\n', False),
    ('int f() { return 1; }\n#include "opbuilder/extension.h"\n', False),
    ('', False),
])
def test_eligible_only_when_the_header_comes_first(tmp_path, text, expected):
    src = tmp_path / "s.cpp"
    src.write_text(text)
    assert pch.eligible(src) is expected


def test_one_pch_serves_every_operator_and_the_compiler_accepts_it(cache_dir, my_ops, ms_ops, api_ops):
    if not pch.enabled():
        pytest.skip("OPBUILDER_PCH is off")
    dirs = [d for d in (cache_dir / ".pch").iterdir() if d.is_dir()]
    assert len(dirs) == 1 and (dirs[0] / "pch.h.gch").is_file()  # built once for all three operators
    built_it = 0
    for op in ("my_ops", "ms_ops", "tensor_api_ops"):
        build = cache_dir / op / "build"
        ninja = (build / "build.ninja").read_text()
        assert f"-include {dirs[0] / 'pch.h'}" in ninja
        built_it += "rule pch" in ninja
        log = (build / "build.log").read_text()
        assert "pch.h.gch" not in log and "-Winvalid-pch" not in log  # gcc did not reject the PCH
    assert built_it == 1
