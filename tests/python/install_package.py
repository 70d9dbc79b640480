#!/usr/bin/python3
"""Installs the package (python/) into SITE with pip, offline, for the Python tests: ctest's
fixture Python.InstallPackage, which every Python test requires; they run with SITE alone on
PYTHONPATH. The install replaces SITE's earlier one, and is checked: `import dsv32` with SITE on
PYTHONPATH loads SITE's copy, the pytest plugin's entry point included.

pip is this python's (`python3 -m pip`), else that of a virtual environment made once beside
SITE from the wheel that Debian's python3-venv carries (no download either way).

usage: install_package.py PACKAGE_DIR SITE"""
import os
import shutil
import subprocess
import sys


def pip_command(site):
    """A command that runs pip, with no network needed."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode == 0:
        return [sys.executable, "-m", "pip"]
    venv = site + "-pip"
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        r = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"no pip: {sys.executable} -m pip is missing and no virtual environment "
                     f"could be made ({r.stderr.strip()[-300:]}); Debian: python3-venv")
    return [python, "-m", "pip"]


def main():
    package, site = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(site, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    r = subprocess.run(pip_command(site) + [
        "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir",
        "--disable-pip-version-check", "--target", site, package],
        capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"pip install failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    probe = ("import dsv32, importlib.metadata as m; print(dsv32.__file__); "
             "print(*[e.value for e in m.distribution('dsv32').entry_points])")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/",
                       env=dict(env, PYTHONPATH=site))
    lines = r.stdout.split("\n") + ["", ""]
    if (r.returncode != 0 or not lines[0].startswith(site + os.sep)
            or "dsv32.pytest_plugin" not in lines[1].split()):
        sys.exit(f"the installed package is not what `import dsv32` loads with PYTHONPATH={site}:"
                 f"\n{r.stdout}{r.stderr}")
    print(f"dsv32 installed in {site} ({lines[0]})")


if __name__ == "__main__":
    main()
