"""Damaged cache contents are detected and repaired, broken bookkeeping is treated as absent, and a
cache that cannot be written is an error that says what to do. Loads of damaged libraries run in
child processes: a SIGBUS there is a failed test, not a dead test run."""
import hashlib
import json
import logging
import os
import re
import signal
import stat
import subprocess

import pytest

from builder_util import PYTHON, build_cache, child_env, copy_cache, key_dir, run_python, tiny_module
from opbuilder import BuildError, CustomOpBuilder
from opbuilder.tools.toolchain import ext_suffix

pytestmark = pytest.mark.build  # every test here compiles (tests/build_guard.py)

NAME = "healer"
LIB = NAME + ext_suffix()

LOAD = """
import sys
from opbuilder import CustomOpBuilder
print(CustomOpBuilder(sys.argv[1], [sys.argv[2]], build_dir=sys.argv[3]).load().value())
"""


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """One build of the operator for the whole session: (its cache, its source). Tests work on copies."""
    work = tmp_path_factory.mktemp("healer")
    return build_cache(work, NAME, "23"), work / f"{NAME}.cpp"


@pytest.fixture
def cache(built, tmp_path):
    return copy_cache(built[0], tmp_path / "cache")


def _child_load(cache, src):
    res = run_python(LOAD, NAME, str(src), str(cache))
    assert res.returncode != -signal.SIGBUS, "the load died of SIGBUS"
    return res


def _damage(lib, how):
    size = lib.stat().st_size
    if how == "truncated":
        os.truncate(lib, size // 2)
    elif how == "zero-byte":
        os.truncate(lib, 0)
    else:  # garbage of the same size: only the SHA-256 can tell
        with open(lib, "r+b") as f:
            f.write(os.urandom(size))


@pytest.mark.parametrize("how", ["truncated", "zero-byte", "garbage"])
def test_a_damaged_library_is_rebuilt_on_the_next_load_and_replaced(cache, built, how):
    lib = key_dir(cache, NAME) / LIB
    good = hashlib.sha256(lib.read_bytes()).hexdigest()
    _damage(lib, how)
    damaged_inode = lib.stat().st_ino
    res = _child_load(cache, built[1])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "23"
    assert f"{lib} is broken" in res.stderr and "building it again" in res.stderr
    assert "building healer" in res.stderr
    assert lib.stat().st_ino != damaged_inode  # replaced by a rename, never written in place
    assert hashlib.sha256(lib.read_bytes()).hexdigest() == good  # the same code as before, relinked
    again = _child_load(cache, built[1])  # and trusted from now on: silent, nothing built
    assert again.returncode == 0 and again.stdout.strip() == "23" and again.stderr == ""


def test_a_library_the_loader_rejects_is_rebuilt(cache, built):
    """Damaged and its record changed to match (size, SHA-256, stamp): every check passes, dlopen does not."""
    kd = key_dir(cache, NAME)
    lib, info = kd / LIB, kd / "build.json"
    lib.write_bytes(b"\x7fELF" + b"\0" * 60)  # an ELF header and nothing else
    data = json.loads(info.read_text())
    st = os.lstat(lib)
    data["library"] = {"size": st.st_size, "sha256": hashlib.sha256(lib.read_bytes()).hexdigest(),
                       "stamp": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]}
    info.write_text(json.dumps(data))
    res = _child_load(cache, built[1])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "23"
    assert f"{lib} cannot be loaded" in res.stderr and "building it again" in res.stderr


def test_a_copied_cache_is_hashed_once_then_trusted_by_its_stamp(cache, built):
    lib = key_dir(cache, NAME) / LIB
    info = lib.parent / "build.json"
    recorded = json.loads(info.read_text())["library"]["stamp"]
    st = os.lstat(lib)
    assert recorded != [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]  # a copy: a new inode
    assert CustomOpBuilder(NAME, [built[1]], build_dir=cache).build() == str(lib)
    assert json.loads(info.read_text())["library"]["stamp"] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                                st.st_ino, st.st_dev]


def _warned(caplog, path):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and f"{path} " in r.getMessage()]


def _toolchains(cache, change):
    path = cache / "toolchains.json"
    data = json.loads(path.read_text())
    path.write_text(change(data) if callable(change) else change)
    return path


TOOLCHAIN_DAMAGE = {
    "not JSON": lambda d: "{",
    "a list": lambda d: "[1, 2]",
    "facts missing": lambda d: json.dumps({k: dict(v, facts={}) for k, v in d.items()}),
    "facts of the wrong type": lambda d: json.dumps({k: dict(v, facts={f: 5 for f in v["facts"]})
                                                    for k, v in d.items()}),
    "stamps not pairs": lambda d: json.dumps({k: dict(v, stamps=[1, 2]) for k, v in d.items()}),
    "records not objects": lambda d: json.dumps({k: "record" for k in d}),
}


@pytest.mark.parametrize("damage", list(TOOLCHAIN_DAMAGE))
def test_a_toolchains_json_of_the_wrong_shape_is_probed_again_with_a_warning(cache, built, caplog, damage):
    path = _toolchains(cache, TOOLCHAIN_DAMAGE[damage])
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        assert CustomOpBuilder(NAME, [built[1]], build_dir=cache).load().value() == 23
    assert _warned(caplog, path), caplog.text
    # the probes were stored again, in the shape that is read
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and any(isinstance(v, dict) and isinstance(v.get("facts"), dict)
                                          and v["facts"].get("identity") for v in data.values())


MANIFEST_DAMAGE = {"not JSON": "{", "a list": "[]", "headers not a list": '{"headers": "h.h"}',
                   "headers not paths": '{"headers": [1, 2]}', "paths climbing out of the project": '{"headers": ["../h.h"]}',
                   "an empty path": '{"headers": [""]}',
                   "no headers": "{}"}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_a_manifest_of_the_wrong_shape_is_rebuilt_with_a_warning(cache, built, caplog, damage):
    (manifest,) = (cache / NAME / "deps").glob("*.json")
    manifest.write_text(MANIFEST_DAMAGE[damage])
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        assert CustomOpBuilder(NAME, [built[1]], build_dir=cache).load().value() == 23
    assert _warned(caplog, manifest), caplog.text
    assert json.loads(manifest.read_text()) == {"headers": []}  # written again


BUILD_INFO_DAMAGE = {"not JSON": "{", "a list": "[]", "no library record (an older opbuilder)": '{"base": "x"}',
                     "library not a record": '{"library": 5}', "size not a number": '{"library": {"size": "1"}}'}


@pytest.mark.parametrize("damage", list(BUILD_INFO_DAMAGE))
def test_a_build_json_of_the_wrong_shape_is_rebuilt_with_a_warning(cache, built, caplog, damage):
    info = key_dir(cache, NAME) / "build.json"
    info.write_text(BUILD_INFO_DAMAGE[damage])
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        assert CustomOpBuilder(NAME, [built[1]], build_dir=cache).load().value() == 23
    assert _warned(caplog, info), caplog.text
    assert isinstance(json.loads(info.read_text())["library"]["sha256"], str)


def _compiled(cache):
    """True if the last build of the operator compiled its source (not only linked)."""
    return f"compiling {NAME}.cpp" in (cache / NAME / "build" / "build.log").read_text()


@pytest.mark.parametrize("damage", ["intact", "not JSON", "a list", "entries not records"])
def test_an_objects_json_of_the_wrong_shape_compiles_again_with_a_warning(cache, built, caplog, damage):
    record = cache / NAME / "build" / "objects.json"
    entries = json.loads(record.read_text())
    record.write_text({"intact": json.dumps(entries), "not JSON": "{", "a list": "[]",
                       "entries not records": json.dumps({k: [1] for k in entries})}[damage])
    (key_dir(cache, NAME) / "build.json").unlink()  # so the load builds: from the objects, if they are trusted
    with caplog.at_level(logging.WARNING, logger="opbuilder"):
        assert CustomOpBuilder(NAME, [built[1]], build_dir=cache).load().value() == 23
    assert _compiled(cache) is (damage != "intact")  # an object without a usable record is compiled again
    if damage in ("not JSON", "a list"):
        assert _warned(caplog, record), caplog.text


def test_a_damaged_object_is_compiled_again(cache, built):
    (obj,) = (cache / NAME / "build" / "obj").glob("*.o")
    os.truncate(obj, 10)
    (key_dir(cache, NAME) / LIB).unlink()  # so the library is linked again, from the objects
    assert CustomOpBuilder(NAME, [built[1]], build_dir=cache).load().value() == 23
    assert _compiled(cache)  # not linked from the truncated object


FULL_DISK = """
import resource, signal, sys
import opbuilder.cache.publish as publish
from opbuilder import BuildError, CustomOpBuilder
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
real = publish.publish_library
def publish_with_no_room(*args):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # the disk fills up while the library is copied
    try:
        return real(*args)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
publish.publish_library = publish_with_no_room
try:
    CustomOpBuilder(sys.argv[1], [sys.argv[2]], build_dir=sys.argv[3]).load()
except BuildError as e:
    print(e)
"""


def test_a_full_disk_while_publishing_is_a_build_error_and_leaves_no_partial_file(cache, built):
    kd = key_dir(cache, NAME)
    (kd / LIB).unlink()
    res = run_python(FULL_DISK, NAME, str(built[1]), str(cache))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"building operator '{NAME}' failed: no room to write {kd}"), res.stdout
    assert "File too large" in res.stdout and "OPBUILDER_CACHE_DIR" in res.stdout
    assert sorted(p.name for p in kd.iterdir()) == ["build.json"]  # no partial library, no temporary file
    ok = _child_load(cache, built[1])  # with room again, the next load publishes it
    assert ok.returncode == 0 and ok.stdout.strip() == "23", ok.stderr


# Read-only caches and an unwritable HOME: as root nothing is read-only, so the child gives up root
# first (after importing what it needs: the interpreter's own files may be readable by root alone, as
# with a pyenv Python under /root; then the stamps of pybind11's files cannot be taken, and the child
# probes Python again, which must not need to read anything).
AS_NOBODY = """
import os, sys, json, hashlib, logging, subprocess, sysconfig, shlex, shutil, dataclasses
import opbuilder.builder, opbuilder.cache.publish, opbuilder.cache.published, opbuilder.cache.lock, opbuilder.compile.ninja_run
import opbuilder.compile.ninja_file, opbuilder.native.pch, opbuilder.tools.toolchain, pybind11
from opbuilder import BuildError, CustomOpBuilder
sysconfig.get_paths()  # loads the interpreter's _sysconfigdata module while it can still be read
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
try:
    print(CustomOpBuilder(sys.argv[1], [sys.argv[2]], build_dir=sys.argv[3] or None).load().value())
except BuildError as e:
    print("BuildError:", e)
"""


@pytest.fixture
def public_dir(tmp_path_factory):
    """A directory another user can reach (pytest's are root's alone), removed afterwards."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="opbuilder-ro-")
    os.chmod(d, 0o755)
    yield __import__("pathlib").Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _give_away(path, uid):
    for d, dirs, files in os.walk(path):
        for n in [d] + [os.path.join(d, x) for x in dirs + files]:
            os.chown(n, uid, uid, follow_symlinks=False)


def _read_only(path):
    for d, dirs, files in os.walk(path):
        for n in [d] + [os.path.join(d, x) for x in dirs + files]:
            st = os.lstat(n)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(n, stat.S_IMODE(st.st_mode) & ~0o222)


def _as_nobody(*args, **env):
    return run_python(AS_NOBODY, *args, **env)


def test_a_read_only_cache_loads_what_it_holds_and_explains_a_cold_build(public_dir):
    # built here (keys hold the sources' paths, and the other user must be able to read the source)
    cache = build_cache(public_dir, "deployed", "23")
    src = public_dir / "deployed.cpp"
    other = tiny_module(public_dir / "newer.cpp", "1")
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    _give_away(public_dir, uid)
    _read_only(cache)
    # a cache prebuilt for deployment, read-only: the build in it loads
    warm = _as_nobody("deployed", str(src), str(cache))
    assert warm.returncode == 0 and warm.stdout.strip() == "23", warm.stderr
    cold = _as_nobody("newer", str(other), str(cache))
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.startswith(f"BuildError: building operator 'newer' failed: cannot write {cache / 'newer'} "
                                  f"in the opbuilder cache {cache}"), cold.stdout
    assert "OPBUILDER_CACHE_DIR" in cold.stdout and "Traceback" not in cold.stderr


def test_an_unwritable_home_is_a_build_error_that_names_opbuilder_cache_dir(public_dir):
    home = public_dir / "home"
    home.mkdir()
    src = tiny_module(public_dir / "homeless.cpp", "1")
    os.chmod(src, 0o644)
    os.chmod(home, 0o555)  # not writable by the child (as root: owned by root, and the child gives root up)
    env = child_env(HOME=str(home))
    env.pop("OPBUILDER_CACHE_DIR", None)
    res = subprocess.run([PYTHON, "-c", AS_NOBODY, "homeless", str(src), ""], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert re.match(rf"BuildError: building operator 'homeless' failed: cannot write {re.escape(str(home))}/\.cache",
                    res.stdout), res.stdout
    assert "set OPBUILDER_CACHE_DIR to a directory you can write to" in res.stdout


def test_build_errors_of_this_kind_are_build_errors():
    # what the CLI and callers catch: the project's own type, with the operator's name
    from opbuilder.errors import cache_os_error
    err = cache_os_error("x", OSError(28, "No space left on device", "/c/x/f"), "/c")
    assert isinstance(err, BuildError) and err.name == "x" and "no room to write /c/x/f" in str(err)
    assert cache_os_error("x", OSError(5, "Input/output error"), "/c") is None
