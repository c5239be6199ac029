"""Errors of a shipped operator that need no wheel to show (docs/shipping.md): under OPBUILDER_NO_BUILD=1 a
package whose sources were deleted (a packager stripping .cpp files) is a NoBuildError naming the operator,
why and the fix, not a bare FileNotFoundError."""
from __future__ import annotations

import pytest

from opbuilder import CustomOpBuilder
from opbuilder.errors import NoBuildError

FIX = ("Fix: install a wheel of the package built for this Python and opbuilder (python -m opbuilder wheel "
       "PKGDIR), or unset OPBUILDER_NO_BUILD to build it here")


def test_deleted_sources_under_no_build_are_a_no_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPBUILDER_NO_BUILD", "1")
    pkg = tmp_path / "pkg"
    (pkg / "csrc").mkdir(parents=True)
    (pkg / "opbuilder_ops.json").write_text('{"format": 1, "hash": "blake2b-256", "ops": {}}')
    source = pkg / "csrc" / "sq_mul.cpp"  # shipped, then deleted
    with pytest.raises(NoBuildError) as info:
        CustomOpBuilder("shipped_ops", [str(source)]).load()
    assert str(info.value) == (f"operator 'shipped_ops' would have to be built, and OPBUILDER_NO_BUILD=1 forbids "
                               f"building: source file of operator 'shipped_ops' not found: {source}, and a shipped "
                               f"binary is used only when the sources it was built from are there to check it "
                               f"against (its wheel ships them). " + FIX)
    assert info.value.name == "shipped_ops"


@pytest.mark.parametrize("value, forbids", [("yes", True), ("true", True), ("false", False), ("no", False),
                                             ("off", False), ("0", False), ("", False)])
def test_no_build_reads_its_value_as_opbuilders_other_switches_do(tmp_path, monkeypatch, value, forbids):
    """OPBUILDER_NO_BUILD=false forbade building (any value but "" and "0" did), and the error said
    OPBUILDER_NO_BUILD=1; fails on d3cc14d. Its value reads as OPBUILDER_PCH's and OPBUILDER_LTO's, and the
    error says the value set."""
    monkeypatch.setenv("OPBUILDER_NO_BUILD", value)
    source = tmp_path / "gone.cpp"
    if not forbids:
        with pytest.raises(FileNotFoundError) as info:
            CustomOpBuilder("gone_ops", [str(source)])
        assert not isinstance(info.value, NoBuildError)
        return
    with pytest.raises(NoBuildError, match=rf"^operator 'gone_ops' would have to be built, and "
                                           rf"OPBUILDER_NO_BUILD={value} forbids building: source file of operator "
                                           rf"'gone_ops' not found: "):
        CustomOpBuilder("gone_ops", [str(source)])


def test_a_missing_source_without_no_build_is_still_file_not_found(tmp_path, monkeypatch):
    monkeypatch.delenv("OPBUILDER_NO_BUILD", raising=False)
    source = tmp_path / "gone.cpp"
    with pytest.raises(FileNotFoundError) as info:
        CustomOpBuilder("gone_ops", [str(source)])
    assert not isinstance(info.value, NoBuildError)
    assert str(info.value) == f"source file of operator 'gone_ops' not found: {source}"


@pytest.mark.build  # (the compiler is asked for its identity, to key the cache)
def test_load_inline_under_no_build_names_the_cache_not_a_wheel(tmp_path, monkeypatch):
    """No wheel carries load_inline's sources, so its NoBuildError says how to fill the cache instead
    (it told the user to install a wheel of the package built with `opbuilder wheel`)."""
    from opbuilder import load_inline
    from opbuilder.errors import NoBuildError

    cache = tmp_path / "cache"
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(cache))
    monkeypatch.setenv("OPBUILDER_NO_BUILD", "1")
    with pytest.raises(NoBuildError) as e:
        load_inline("never_built", "int answer() { return 42; }", functions=["answer"])
    assert str(e.value) == (
        "operator 'never_built' would have to be built, and OPBUILDER_NO_BUILD=1 forbids building: "
        f"load_inline's sources of 'never_built' are not built in this cache ({cache}). Fix: run the same "
        "load_inline once where a compiler is, with this OPBUILDER_CACHE_DIR, or move the sources into a "
        "package that ships a wheel (docs/shipping.md), or unset OPBUILDER_NO_BUILD to build it here")


def test_a_stale_installed_runtime_says_to_reinstall_opbuilder_not_to_rebuild_the_wheel(tmp_path, monkeypatch):
    """The shipped binary did not fit because opbuilder's own installed runtime does not (an editable install
    after its headers changed): a wheel rebuilt for this opbuilder would be refused the same way. Before, the
    fix said to install such a wheel; doctor already said to reinstall opbuilder."""
    from opbuilder.cache import shipped

    monkeypatch.setenv("OPBUILDER_NO_BUILD", "1")
    monkeypatch.setenv("OPBUILDER_CACHE_DIR", str(tmp_path / "no-cache-yet"))
    monkeypatch.delenv("OPBUILDER_PREBUILT_DIR", raising=False)
    source = tmp_path / "op.cpp"
    source.write_text("// an operator\n")
    spec = CustomOpBuilder("stale_rt_ops", [str(source)]).spec
    why = "opbuilder's installed runtime was built for headers 'aaa', this build needs 'bbb'"
    monkeypatch.setitem(shipped._why, "stale_rt_ops", why)
    with pytest.raises(NoBuildError) as info:
        shipped.built_instead(spec, lambda: pytest.fail("nothing is built under OPBUILDER_NO_BUILD=1"))
    assert str(info.value) == (
        f"operator 'stale_rt_ops' would have to be built, and OPBUILDER_NO_BUILD=1 forbids building: {why}. Fix: "
        f"reinstall opbuilder (pip install -e . in a checkout) with a C++ compiler present, so that its installed "
        f"runtime is built for its headers and this Python, or unset OPBUILDER_NO_BUILD to build it here")
