# SPDX-License-Identifier: Apache-2.0
"""pydyad's PEP 517 build backend, written with the standard library only.

pydyad is pure Python: a wheel is a zip of the package's .py files plus a
.dist-info directory (METADATA, WHEEL, RECORD). Writing it here, instead of
asking for setuptools, means pip needs nothing to build it: with
``requires = []`` in pyproject.toml, ``pip install ./python`` works with
pip's default build isolation and no network (see docs/design.md).

Hooks: build_wheel, build_sdist, build_editable, prepare_metadata_for_build_
wheel/editable and the get_requires_for_build_* hooks (all return []).

What goes in: the packages listed under [tool.pydyad-build] in
pyproject.toml (every .py file below them), the [project] table's metadata,
and the version from pydyad/_version.py. When the source sits in the DYAD
tree (../CMakeLists.txt with ``project(dyad_cpp VERSION x.y.z ...)``), the two
versions must agree, or the build fails.
"""
import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import time
import zipfile

__all__ = [
    "build_editable", "build_sdist", "build_wheel", "get_requires_for_build_editable",
    "get_requires_for_build_sdist", "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable", "prepare_metadata_for_build_wheel",
]

# The source tree: the directory holding pyproject.toml (also in an sdist).
SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = "pydyad_build (in-tree, standard library only)"


# -- reading pyproject.toml ----------------------------------------------------

def _parse_toml_subset(text):
    """Enough TOML for a pyproject.toml like ours, for Pythons without
    tomllib (< 3.11): [tables], and keys whose values are strings, booleans,
    integers or arrays of strings (arrays may span lines)."""
    data = {}
    table = data
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            table = data
            for part in line.strip("[]").split("."):
                table = table.setdefault(part.strip().strip('"'), {})
            continue
        key, _, value = line.partition("=")
        key, value = key.strip().strip('"'), value.strip()
        if value.startswith("[") and not _array_closed(value):
            for more in lines:
                value += " " + more.strip()
                if _array_closed(value):
                    break
        table[key] = _toml_value(value)
    return data


def _array_closed(value):
    return _strip_comment(value).rstrip().endswith("]")


def _strip_comment(value):
    out, quote = [], None
    for ch in value:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        out.append(ch)
    return "".join(out)


def _toml_value(value):
    value = _strip_comment(value).strip()
    if value.startswith("["):
        inner = value[1:-1]
        return [_toml_value(v) for v in re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', inner)]
    if value.startswith('"'):
        return value[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    if value.startswith("'"):
        return value[1:-1]
    if value in ("true", "false"):
        return value == "true"
    return int(value)


def _read_pyproject():
    with open(os.path.join(SOURCE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
    except ImportError:
        return _parse_toml_subset(raw.decode("utf-8"))
    return tomllib.loads(raw.decode("utf-8"))


# -- the project's description ---------------------------------------------------

def _package_version(package):
    path = os.path.join(SOURCE, package, "_version.py")
    with open(path, encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', f.read(), re.M)
    if not m:
        raise RuntimeError(f"{path}: no __version__ = \"x.y.z\" line")
    return m.group(1)


def cmake_version(cmakelists):
    """The VERSION of ``project(dyad_cpp VERSION x.y.z ...)`` in a CMakeLists.txt,
    or None when the file has no such line."""
    with open(cmakelists, encoding="utf-8") as f:
        m = re.search(r"^\s*project\s*\(\s*dyad_cpp\b[^)]*?\bVERSION\s+([0-9][0-9A-Za-z.]*)", f.read(),
                      re.M | re.I)
    return m.group(1) if m else None


class Project:
    def __init__(self):
        pyproject = _read_pyproject()
        meta = pyproject["project"]
        tool = pyproject.get("tool", {}).get("pydyad-build", {})
        self.meta = meta
        self.name = meta["name"]
        self.packages = tool.get("packages", [self.name])
        if "version" in meta:
            self.version = meta["version"]
        else:
            self.version = _package_version(self.packages[0])
        cmakelists = os.path.join(SOURCE, "..", "CMakeLists.txt")
        if os.path.exists(cmakelists):
            theirs = cmake_version(cmakelists)
            if theirs is not None and theirs != self.version:
                raise RuntimeError(
                    f"version mismatch: {self.packages[0]}/_version.py says {self.version}, "
                    f"CMakeLists.txt's project(dyad_cpp VERSION ...) says {theirs}")
        self.dist = re.sub(r"[-_.]+", "_", self.name).lower()  # file-name form
        self.dist_info = f"{self.dist}-{self.version}.dist-info"
        self.wheel_name = f"{self.dist}-{self.version}-py3-none-any.whl"
        self.sdist_base = f"{self.dist}-{self.version}"

    def metadata(self):
        """The core metadata (METADATA in a wheel, PKG-INFO in an sdist)."""
        m = self.meta
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        if m.get("description"):
            lines.append(f"Summary: {m['description']}")
        if m.get("requires-python"):
            lines.append(f"Requires-Python: {m['requires-python']}")
        for dep in m.get("dependencies", []):
            lines.append(f"Requires-Dist: {dep}")
        for extra, deps in m.get("optional-dependencies", {}).items():
            lines.append(f"Provides-Extra: {extra}")
            for dep in deps:
                lines.append(f'Requires-Dist: {dep}; extra == "{extra}"')
        body = ""
        readme = m.get("readme")
        if isinstance(readme, dict):
            readme = readme.get("file")
        if readme:
            kind = "text/markdown" if readme.endswith(".md") else "text/plain"
            lines.append(f"Description-Content-Type: {kind}")
            with open(os.path.join(SOURCE, readme), encoding="utf-8") as f:
                body = f.read()
        return ("\n".join(lines) + "\n\n" + body).encode("utf-8")

    def wheel_file(self):
        return (f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\n"
                "Tag: py3-none-any\n").encode("utf-8")

    def package_files(self):
        """(path in the archive, path on disk) of every file of the packages."""
        out = []
        for pkg in self.packages:
            top = os.path.join(SOURCE, pkg)
            if not os.path.isfile(os.path.join(top, "__init__.py")):
                raise RuntimeError(f"{top}: not a package (no __init__.py)")
            for d, dirs, files in os.walk(top):
                dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
                for fn in sorted(files):
                    if fn.endswith((".pyc", ".pyo")) or fn.startswith("."):
                        continue
                    disk = os.path.join(d, fn)
                    out.append((os.path.relpath(disk, SOURCE).replace(os.sep, "/"), disk))
        return out


# -- archives -------------------------------------------------------------------------

def _timestamp(path=None):
    """SOURCE_DATE_EPOCH when set (reproducible builds), else the file's mtime;
    never before 1980 (zip cannot say so)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = int(epoch) if epoch else int(os.path.getmtime(path) if path else time.time())
    return max(t, 315532800)


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"sha256={digest}"


class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, mtime=None):
        info = zipfile.ZipInfo(arcname, time.gmtime(mtime or _timestamp())[:6])
        info.external_attr = (0o100644 & 0xFFFF) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        self.record.append(f"{arcname},{_record_hash(data)},{len(data)}")

    def close(self, dist_info):
        name = f"{dist_info}/RECORD"
        body = "\n".join(self.record + [f"{name},,"]) + "\n"
        info = zipfile.ZipInfo(name, time.gmtime(_timestamp())[:6])
        info.external_attr = (0o100644 & 0xFFFF) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, body.encode("utf-8"))
        self.zip.close()


def _write_wheel(wheel_directory, project, files, extra_dist_info=()):
    os.makedirs(wheel_directory, exist_ok=True)
    target = os.path.join(wheel_directory, project.wheel_name)
    tmp = target + ".part"
    w = _Wheel(tmp)
    try:
        for arcname, data, mtime in files:
            w.add(arcname, data, mtime)
        di = project.dist_info
        w.add(f"{di}/METADATA", project.metadata())
        w.add(f"{di}/WHEEL", project.wheel_file())
        w.add(f"{di}/top_level.txt", ("\n".join(project.packages) + "\n").encode("utf-8"))
        for arcname, data in extra_dist_info:
            w.add(f"{di}/{arcname}", data)
        w.close(di)
    except BaseException:
        w.zip.close()
        os.unlink(tmp)
        raise
    os.replace(tmp, target)
    return project.wheel_name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# -- PEP 517 / PEP 660 hooks --------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project = Project()
    d = os.path.join(metadata_directory, project.dist_info)
    os.makedirs(d, exist_ok=True)
    for name, data in (("METADATA", project.metadata()), ("WHEEL", project.wheel_file()),
                       ("top_level.txt", ("\n".join(project.packages) + "\n").encode("utf-8"))):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return project.dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = Project()
    files = [(arc, _read(disk), _timestamp(disk)) for arc, disk in project.package_files()]
    return _write_wheel(wheel_directory, project, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel holding a .pth file that puts this source directory on
    sys.path: edits to pydyad/ take effect without reinstalling."""
    project = Project()
    pth = (SOURCE + "\n").encode(sys.getfilesystemencoding())
    return _write_wheel(wheel_directory, project, [(f"__editable__.{project.dist}.pth", pth, None)])


def build_sdist(sdist_directory, config_settings=None):
    """pyproject.toml, README, PKG-INFO, the packages and this backend, in
    NAME-VERSION/ inside a .tar.gz (builds offline the same way)."""
    project = Project()
    base = project.sdist_base
    members = [("pyproject.toml", os.path.join(SOURCE, "pyproject.toml"))]
    readme = project.meta.get("readme")
    if isinstance(readme, dict):
        readme = readme.get("file")
    if readme:
        members.append((readme, os.path.join(SOURCE, readme)))
    backend_dir = os.path.dirname(os.path.abspath(__file__))
    for fn in sorted(os.listdir(backend_dir)):
        if fn.endswith(".py"):
            members.append((os.path.relpath(os.path.join(backend_dir, fn), SOURCE).replace(os.sep, "/"),
                            os.path.join(backend_dir, fn)))
    members += project.package_files()
    os.makedirs(sdist_directory, exist_ok=True)
    name = f"{base}.tar.gz"
    target = os.path.join(sdist_directory, name)
    tmp = target + ".part"

    def add(tar, arcname, data, mtime):
        info = tarfile.TarInfo(f"{base}/{arcname}")
        info.size, info.mtime, info.mode = len(data), mtime, 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(data))

    try:
        with open(tmp, "wb") as raw:
            import gzip
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=_timestamp()) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    add(tar, "PKG-INFO", project.metadata(), _timestamp())
                    for arcname, disk in members:
                        add(tar, arcname, _read(disk), _timestamp(disk))
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, target)
    return name
