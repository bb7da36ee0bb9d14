# SPDX-License-Identifier: Apache-2.0
"""pydyad as a Python package: the in-tree build backend (wheel, sdist,
editable), its version, and `pip install ./python` into a plain virtual
environment with no index at all, then produce/consume through real services
with the installed package finding an installed libdyad by itself."""
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pydyad
from pydyad_testlib import PYTHON_DIR, ROOT, SANITIZER_ENV, harness, last_json

sys.path.insert(0, os.path.join(PYTHON_DIR, "_build_backend"))
import pydyad_build  # noqa: E402


def cmake_project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*dyad_cpp\s+VERSION\s+([0-9.]+)", f.read())
    assert m, "CMakeLists.txt has no project(dyad_cpp VERSION x.y.z ...)"
    return m.group(1)


def test_version_is_the_cmake_project_version():
    assert pydyad.__version__ == cmake_project_version()
    assert pydyad_build.Project().version == pydyad.__version__


def test_toml_fallback_parser_reads_pyproject_as_tomllib_does():
    import tomllib
    with open(os.path.join(PYTHON_DIR, "pyproject.toml")) as f:
        text = f.read()
    assert pydyad_build._parse_toml_subset(text) == tomllib.loads(text)


def _hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_wheel_is_complete_and_its_record_is_right(tmp_path):
    name = pydyad_build.build_wheel(str(tmp_path))
    v = pydyad.__version__
    assert name == f"pydyad-{v}-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / name) as z:
        names = z.namelist()
        di = f"pydyad-{v}.dist-info"
        sources = sorted(f"pydyad/{f}" for f in os.listdir(os.path.join(PYTHON_DIR, "pydyad")) if f.endswith(".py"))
        assert sorted(n for n in names if n.startswith("pydyad/")) == sources
        assert {f"{di}/METADATA", f"{di}/WHEEL", f"{di}/RECORD", f"{di}/top_level.txt"} <= set(names)
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        meta = z.read(f"{di}/METADATA").decode()
        assert f"Name: pydyad\nVersion: {v}\n" in meta
        assert 'Requires-Dist: h5py; extra == "hdf"' in meta and "Requires-Python: >=3.8" in meta
        assert "Description-Content-Type: text/markdown" in meta and "# pydyad" in meta
        wheel = z.read(f"{di}/WHEEL").decode()
        assert "Root-Is-Purelib: true" in wheel and "Tag: py3-none-any" in wheel
        rows = list(csv.reader(io.StringIO(z.read(f"{di}/RECORD").decode())))
        assert sorted(r[0] for r in rows) == sorted(names)
        for path, digest, size in rows:
            if path == f"{di}/RECORD":
                assert digest == size == ""
                continue
            data = z.read(path)
            assert digest == _hash(data) and int(size) == len(data), path
        assert z.read("pydyad/_version.py") == open(os.path.join(PYTHON_DIR, "pydyad", "_version.py"), "rb").read()


def test_sdist_and_editable_wheel(tmp_path):
    v = pydyad.__version__
    name = pydyad_build.build_sdist(str(tmp_path))
    assert name == f"pydyad-{v}.tar.gz"
    with tarfile.open(tmp_path / name) as t:
        members = set(t.getnames())
        pkg_info = t.extractfile(f"pydyad-{v}/PKG-INFO").read().decode()
    assert {f"pydyad-{v}/{p}" for p in ("pyproject.toml", "README.md", "pydyad/__init__.py",
                                         "pydyad/_version.py", "_build_backend/pydyad_build.py")} <= members
    assert f"Version: {v}" in pkg_info
    ed = pydyad_build.build_editable(str(tmp_path / "ed"))
    with zipfile.ZipFile(tmp_path / "ed" / ed) as z:
        pth = [n for n in z.namelist() if n.endswith(".pth")]
        assert len(pth) == 1 and z.read(pth[0]).decode().strip() == PYTHON_DIR


def test_backend_refuses_a_version_that_differs_from_cmake(tmp_path):
    shutil.copytree(PYTHON_DIR, tmp_path / "python", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "CMakeLists.txt").write_text("project(dyad_cpp VERSION 9.8.7 LANGUAGES C CXX)\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pydyad_build; "
            "pydyad_build.build_wheel(sys.argv[2])")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "python" / "_build_backend"),
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert p.returncode != 0 and "version mismatch" in p.stderr and "9.8.7" in p.stderr
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


# -- pip install ./python into a plain venv, offline -------------------------------

def _clean_env(base=None, **extra):
    """`base` (default: this environment without DYAD_*) without anything
    that would point Python at the source tree or at pip's settings: what a
    user's shell would have. DYAD_LIBRARY is never set."""
    if base is None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
    env = {k: v for k, v in base.items()
           if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV")) and k != "DYAD_LIBRARY"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _tree(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, dirs, files in os.walk(top)
                  for f in files if "__pycache__" not in d)


PRODUCER = """
import json, os, sys
import pydyad
from pydyad import Dyad, dyad_open
d = os.environ["DYAD_PATH_PRODUCER"]
# Plain function: a file object; produced when closed.
f = dyad_open(os.path.join(d, "plain.txt"), "w")
f.write("written without with")
f.close()
# Context manager.
with dyad_open(os.path.join(d, "ctx.bin"), "wb") as f:
    f.write(b"written with with")
print(json.dumps({"version": pydyad.__version__, "module": pydyad.__file__,
                  "library": pydyad.bindings.library_path(), "type": type(f).__name__}))
"""

CONSUMER = """
import json, os
import pydyad
from pydyad import dyad_open
d = os.environ["DYAD_PATH_CONSUMER"]
f = dyad_open(os.path.join(d, "plain.txt"))       # waits, fetches, opens
plain = f.read()
f.close()
with dyad_open(os.path.join(d, "ctx.bin"), "rb") as f:
    ctx = f.read().decode()
print(json.dumps({"plain": plain, "ctx": ctx, "library": pydyad.bindings.library_path()}))
"""


def test_pip_install_offline_into_a_plain_venv(cluster, tmp_path):
    venv = tmp_path / "venv"
    py = str(venv / "bin" / "python")
    env = _clean_env(PIP_NO_INDEX=1, PIP_DISABLE_PIP_VERSION_CHECK=1, PIP_NO_CACHE_DIR=1)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    before = _tree(PYTHON_DIR)
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "./python"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"pip install failed:\n{p.stdout}\n{p.stderr}"
    assert f"Successfully installed pydyad-{pydyad.__version__}" in p.stdout
    assert _tree(PYTHON_DIR) == before, "building the wheel wrote into the source tree"

    # Outside the source tree, the package is the installed one, and with no
    # libdyad installed anywhere it says where it looked.
    run = dict(cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    probe = ("import json, pydyad, pydyad.bindings as b\n"
             "try:\n    b.find_library(); err = None\nexcept b.DyadLibraryError as e:\n    err = str(e)\n"
             "print(json.dumps([pydyad.__version__, pydyad.__file__, err, b.install_dirs()]))")
    p = subprocess.run([py, "-c", probe], env=_clean_env(), **run)
    assert p.returncode == 0, p.stderr
    version, module, err, dirs = last_json(p.stdout)
    assert version == pydyad.__version__
    assert module.startswith(str(venv)), module
    assert dirs[0] == str(venv / "lib"), dirs
    installed_elsewhere = err is None  # e.g. a libdyad in /usr/local/lib on this machine
    if not installed_elsewhere:
        assert "DYAD_LIBRARY" in err and str(venv / "lib") in err and "find_library" in err

    # Install DYAD into the venv's prefix as a user would (cmake --install):
    # libdyad.so.0 lands in venv/lib, where pydyad looks first.
    p = subprocess.run(["cmake", "--install", harness.BUILD, "--prefix", str(venv)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lib_in_venv = [os.path.join(d, "libdyad.so.0") for d in ("lib", os.path.join("lib", "x86_64-linux-gnu"))
                   if os.path.exists(os.path.join(venv, d, "libdyad.so.0"))]
    assert lib_in_venv, "cmake --install put no libdyad.so.0 in PREFIX/lib"

    prod, cons = cluster[0], cluster[1]
    consumer = subprocess.Popen([py, "-c", CONSUMER],
                                env=_clean_env(cons.env(producer=False), DYAD_WAIT_TIMEOUT=60, **SANITIZER_ENV),
                                cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        p = subprocess.run([py, "-c", PRODUCER], env=_clean_env(prod.env(consumer=False), **SANITIZER_ENV), **run)
        assert p.returncode == 0, p.stderr
        out = last_json(p.stdout)
        c_out, c_err = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, c_err
    got = last_json(c_out)
    assert out["version"] == pydyad.__version__ and out["module"].startswith(str(venv))
    assert out["type"] == "DyadBufferedWriter"
    if not installed_elsewhere:
        # DYAD_LIBRARY is not set: the venv's libdyad, found by itself.
        assert out["library"].startswith(str(venv)) and got["library"].startswith(str(venv)), (out, got)
    assert got["plain"] == "written without with" and got["ctx"] == "written with with"
    assert prod.status()["counters"]["served"] == 2

