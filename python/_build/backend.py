"""The package's own PEP 517 / PEP 660 build backend (standard library only): pip builds the
wheel without downloading a build system, so `pip install ./python` works offline.

A wheel holds dsv32/ (the .py files), dsv32/_checkout.py (where this checkout is, so that the
installed package finds the checkout's build/*/tools/dsv32) and the dist-info. An editable wheel
holds a .pth file naming python/ instead of the files."""
import base64
import hashlib
import os
import re
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/


def _project():
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    try:
        import tomllib
        return tomllib.loads(text)["project"]
    except ImportError:  # Python < 3.11: the few keys this backend reads
        def key(k):
            return re.search(rf'^{k} = "([^"]*)"', text, re.M).group(1)
        return {"name": key("name"), "version": key("version"), "description":
                key("description"), "requires-python": key("requires-python"),
                "dependencies": ["numpy"], "optional-dependencies": {"torch": ["torch"]},
                "entry-points": {"pytest11": {"dsv32": "dsv32.pytest_plugin"}}}


def _dist_info(p):
    name = f"{p['name']}-{p['version']}.dist-info"
    meta = [f"Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
            f"Summary: {p['description']}", f"Requires-Python: {p['requires-python']}"]
    meta += [f"Requires-Dist: {d}" for d in p["dependencies"]]
    for extra, deps in p.get("optional-dependencies", {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    entry = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
                    for group, eps in p.get("entry-points", {}).items())
    wheel = "Wheel-Version: 1.0\nGenerator: dsv32-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return name, {f"{name}/METADATA": "\n".join(meta) + "\n", f"{name}/WHEEL": wheel,
                  f"{name}/entry_points.txt": entry}


def _write_wheel(directory, files):
    p = _project()
    info, extra = _dist_info(p)
    files = dict(files)
    files.update({k: v.encode() for k, v in extra.items()})
    record = []
    wheel_name = f"{p['name']}-{p['version']}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(files):
            data = files[path]
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel_name


def _sources():
    files = {}
    for root, dirs, names in os.walk(os.path.join(HERE, "dsv32")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            if n.endswith(".py"):
                full = os.path.join(root, n)
                files[os.path.relpath(full, HERE).replace(os.sep, "/")] = open(full, "rb").read()
    checkout = os.path.dirname(HERE)
    files["dsv32/_checkout.py"] = (f'"""Written by the build: the checkout this package was '
                                   f'installed from."""\nCHECKOUT = {checkout!r}\n').encode()
    return files


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _sources())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, {"dsv32-editable.pth": (HERE + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError("no sdist: install from the checkout (pip install ./python)")


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_editable = get_requires_for_build_wheel
