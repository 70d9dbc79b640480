"""What the tests of this folder share (pytest finds this file; ctest runs each test file through
tests/python/run_pytest.py, the package installed): the committed goldens, and a scratch folder
a test module, and (`files`) copies of goldens in it for the bad-input tests.

$DSV32_FIXTURES names the goldens (default: the checkout's fixtures/); $DSV32_SCRATCH a folder
under which each module gets an emptied one of its own name (default: pytest's temporary
folders); $DSV32_TOOL the dsv32 tool (else the package finds the checkout's build)."""
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def fixtures_dir():
    return os.environ.get("DSV32_FIXTURES") or os.path.join(ROOT, "fixtures")


@pytest.fixture(scope="module")
def scratch(request, tmp_path_factory):
    """An empty folder for the module's files, kept after the run."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    base = os.environ.get("DSV32_SCRATCH")
    if not base:
        return str(tmp_path_factory.mktemp(name))
    d = os.path.join(base, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


@pytest.fixture(scope="module")
def files(scratch):
    """bad_input_tool.Files in the module's scratch folder."""
    from bad_input_tool import Files
    return Files(scratch)
