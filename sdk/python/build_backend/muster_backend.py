"""The PEP 517 build backend of the muster Python package: standard library
only, so that ``pip install ./sdk/python`` needs no network (pip's isolated
build environment installs nothing: pyproject.toml requires nothing).

It builds the wheel (``muster-<version>-py3-none-any.whl``), the sdist and an
editable wheel (PEP 660: a ``.pth`` file naming this directory). The
metadata comes from pyproject.toml's ``[project]`` table; the version from
``muster/_version.py`` (the C library's: CMake checks that they agree).

From the command line (what the CMake build runs)::

    python3 build_backend/muster_backend.py wheel OUTDIR
"""

import base64
import gzip
import hashlib
import io
import os
import re
import sys
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # sdk/python
PACKAGE = "muster"
TAG = "py3-none-any"
# Entries get this time, so that the same sources make the same archive
# (SOURCE_DATE_EPOCH, where set, wins).
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01


def _pyproject():
    """pyproject.toml's [project] table."""
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the subset of TOML this file uses
        return _toml_subset(raw.decode("utf-8"))["project"]
    return tomllib.loads(raw.decode("utf-8"))["project"]


def _toml_subset(text):
    """The TOML that pyproject.toml here uses: [tables], bare keys, and
    values that are strings, booleans, arrays (over several lines too) and
    inline tables of those. Anything else raises ValueError."""
    import ast
    out, table, pending = {}, None, ""
    for line in text.splitlines():
        line = line.strip() if pending else line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if not pending and re.fullmatch(r"\[[A-Za-z0-9_.-]+\]", line):
            table = out.setdefault(line[1:-1], {})
            continue
        pending += " " + line
        key, _, value = pending.partition("=")
        if value.count("[") + value.count("{") > value.count("]") + value.count("}"):
            continue  # an array or table that goes on on the next line
        pending = ""
        py = re.sub(r"([{,]\s*)([A-Za-z0-9_-]+)\s*=", r'\1"\2":', value.strip())
        py = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", py))
        if table is None:
            raise ValueError("pyproject.toml: a key outside a table: %s" % key.strip())
        table[key.strip()] = ast.literal_eval(py)
    return out


def _version():
    with open(os.path.join(HERE, PACKAGE, "_version.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([0-9A-Za-z.+-]+)"$', f.read(), re.M)
    if not m:
        raise RuntimeError("%s/_version.py has no __version__ = \"X.Y.Z\" line" % PACKAGE)
    return m.group(1)


def _metadata():
    """The core metadata (METADATA / PKG-INFO) as text."""
    p = _pyproject()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % _version(),
             "Summary: %s" % p.get("description", "")]
    if "requires-python" in p:
        lines.append("Requires-Python: %s" % p["requires-python"])
    lic = p.get("license", {})
    if isinstance(lic, dict) and "text" in lic:
        lines.append("License: %s" % lic["text"])
    for a in p.get("authors", []):
        lines.append("Author: %s" % a.get("name", ""))
    if p.get("keywords"):
        lines.append("Keywords: %s" % ",".join(p["keywords"]))
    for c in p.get("classifiers", []):
        lines.append("Classifier: %s" % c)
    for name, url in p.get("urls", {}).items():
        lines.append("Project-URL: %s, %s" % (name, url))
    for dep in p.get("dependencies", []):
        lines.append("Requires-Dist: %s" % dep)
    body = ""
    readme = p.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _package_files():
    """(path in the archive, path here) of the package's files, sorted."""
    out = []
    root = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            out.append(("%s/%s" % (PACKAGE, name), os.path.join(root, name)))
    return out


def _dist_info():
    return "%s-%s.dist-info" % (PACKAGE, _version())


def _wheel_name():
    return "%s-%s-%s.whl" % (PACKAGE, _version(), TAG)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _write_wheel(path, files):
    """A wheel at path holding files ((name, bytes), ...) and its dist-info."""
    info = _dist_info()
    files = list(files) + [
        ("%s/METADATA" % info, _metadata().encode("utf-8")),
        ("%s/WHEEL" % info, ("Wheel-Version: 1.0\nGenerator: muster_backend\n"
                             "Root-Is-Purelib: true\nTag: %s\n" % TAG).encode()),
        ("%s/top_level.txt" % info, (PACKAGE + "\n").encode()),
    ]
    record = [_record_line(n, d) for n, d in files] + ["%s/RECORD,," % info]
    files.append(("%s/RECORD" % info, ("\n".join(record) + "\n").encode()))
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            zi = zipfile.ZipInfo(name, date_time=_zip_time())
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, path)


def _zip_time():
    t = time.gmtime(max(EPOCH, 315532800))
    return t[:6]


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# --- PEP 517 / PEP 660 hooks ------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = _dist_info()
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    os.makedirs(wheel_directory, exist_ok=True)
    name = _wheel_name()
    _write_wheel(os.path.join(wheel_directory, name),
                 [(n, _read(p)) for n, p in _package_files()])
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose .pth file puts this directory on sys.path: edits to
    the sources take effect without reinstalling."""
    os.makedirs(wheel_directory, exist_ok=True)
    name = _wheel_name()
    _write_wheel(os.path.join(wheel_directory, name),
                 [("_muster_editable.pth", (HERE + "\n").encode("utf-8"))])
    return name


def build_sdist(sdist_directory, config_settings=None):
    os.makedirs(sdist_directory, exist_ok=True)
    base = "%s-%s" % (PACKAGE, _version())
    name = base + ".tar.gz"
    members = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
               ("build_backend/muster_backend.py", os.path.abspath(__file__))]
    readme = _pyproject().get("readme")
    if readme:
        members.append((readme, os.path.join(HERE, readme)))
    members += _package_files()
    tmp = os.path.join(sdist_directory, name + ".part")
    # gzip's header carries a time and a name too: EPOCH, and none.
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                               mtime=EPOCH) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(arcname, data):
            ti = tarfile.TarInfo("%s/%s" % (base, arcname))
            ti.size, ti.mtime, ti.mode = len(data), EPOCH, 0o644
            tar.addfile(ti, io.BytesIO(data))
        for arcname, path in members:
            add(arcname, _read(path))
        add("PKG-INFO", _metadata().encode("utf-8"))
    os.replace(tmp, os.path.join(sdist_directory, name))
    return name


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("wheel", "sdist"):
        sys.exit("usage: muster_backend.py wheel|sdist OUTDIR")
    out = (build_wheel if sys.argv[1] == "wheel" else build_sdist)(sys.argv[2])
    print(os.path.join(sys.argv[2], out))
