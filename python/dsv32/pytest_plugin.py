"""dsv32's pytest plugin (registered by `pip install ./python`; in a checkout, `-p
dsv32.pytest_plugin`): a user's test checks their torch layer in a few lines.

    def test_my_layer(dsv32_check, dsv32_golden):
        dsv32_check(MyLayer.from_golden(dsv32_golden))

    pytest --dsv32-golden fixtures/default.h5 --dsv32-mode all --dsv32-device cuda

Options: `--dsv32-golden PATH` (again for more goldens: the test runs once each; or the ini
option `dsv32_golden`, one path a line, relative to the ini file), `--dsv32-mode` (eager, full,
narrow, wide, several comma-separated, or `all`; default eager), `--dsv32-device` (default:
cuda where torch sees one, else cpu). A test that asks for a golden when none is given is a
usage error, not a skip (a run that checked nothing must not pass); a golden that is no regular
file is refused before any test runs. A capture mode skips, with the reason, where no CUDA
device is. A failure prints the judge's first failing step, layer and stage, the runner's
notes and the command that judges the candidate again.
"""
import os

import pytest

MODES = ("eager", "full", "narrow", "wide")
_GOLDENS = pytest.StashKey[list]()


def pytest_addoption(parser):
    g = parser.getgroup("dsv32", "dsv32-oracle: check a torch layer against golden files")
    g.addoption("--dsv32-golden", action="append", default=[], metavar="PATH",
                help="a golden file (again for more)")
    g.addoption("--dsv32-mode", default="eager", metavar="MODES",
                help="eager, full, narrow, wide, comma-separated, or all (default eager)")
    g.addoption("--dsv32-device", default=None, metavar="DEVICE",
                help="torch device (default: cuda where available, else cpu)")
    parser.addini("dsv32_golden", "golden files dsv32's fixtures run over (one a line)",
                  type="paths", default=[])


def _golden_paths(config):
    """--dsv32-golden's paths, else the ini option's; each checked to be a regular file."""
    paths = [str(p) for p in config.getoption("dsv32_golden") or config.getini("dsv32_golden")]
    if not paths:
        return paths
    from dsv32.golden import GoldenFileError, require_regular_file
    for p in paths:
        try:
            require_regular_file(p)
        except GoldenFileError as e:
            raise pytest.UsageError(f"--dsv32-golden {e}") from None
    return paths


def _check_device(config):
    """--dsv32-device, when given, is a device torch has here (a usage error otherwise, not a
    failure inside every test's layer)."""
    d = config.getoption("dsv32_device")
    if d is None:
        return
    try:
        import torch
    except ImportError:
        return  # dsv32_check skips, saying torch is missing
    try:
        dev = torch.device(d)
    except (RuntimeError, TypeError) as e:
        raise pytest.UsageError(f"--dsv32-device {d!r} is no torch device ({e})") from None
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.type not in ("cpu", "cuda") or (dev.type == "cuda" and (dev.index or 0) >= n):
        raise pytest.UsageError(f"--dsv32-device {d!r}: not here (cpu, or one of {n} CUDA "
                                "devices)")


def pytest_configure(config):
    _modes(config)
    _check_device(config)
    config.stash[_GOLDENS] = _golden_paths(config)


def _modes(config):
    text = config.getoption("dsv32_mode")
    modes = MODES if text == "all" else tuple(m.strip() for m in text.split(","))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise pytest.UsageError(f"--dsv32-mode {text!r}: {bad[0]!r} is no mode; give "
                                f"{', '.join(MODES)} (comma-separated) or all")
    if len(set(modes)) != len(modes):
        raise pytest.UsageError(f"--dsv32-mode {text!r}: a mode given twice")
    return modes


def pytest_generate_tests(metafunc):
    if "dsv32_mode" in metafunc.fixturenames:
        metafunc.parametrize("dsv32_mode", _modes(metafunc.config), scope="session")
    if "dsv32_golden_path" in metafunc.fixturenames:
        paths = metafunc.config.stash[_GOLDENS]
        if not paths:
            return  # pytest_collection_modifyitems says so, as a usage error
        ids = [os.path.basename(p) for p in paths]
        metafunc.parametrize("dsv32_golden_path", paths, ids=ids if len(set(ids)) == len(ids)
                             else None, scope="session")


def pytest_collection_modifyitems(config, items):
    if config.stash[_GOLDENS]:
        return
    needs = [i.nodeid for i in items if "dsv32_golden_path" in getattr(i, "fixturenames", ())]
    if needs:
        raise pytest.UsageError(
            f"{needs[0]}{f' (and {len(needs) - 1} more)' if len(needs) > 1 else ''} checks a golden, and none was given: pass "
            "--dsv32-golden PATH, or set dsv32_golden in the ini file (deselect those tests to "
            "run without one)")


@pytest.fixture(scope="session")
def dsv32_device(request):
    d = request.config.getoption("dsv32_device")
    if d:
        return d
    try:
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


@pytest.fixture(scope="session")
def dsv32_golden_path(request):
    """A golden's path: parametrized over --dsv32-golden (pytest_generate_tests)."""
    return request.param


@pytest.fixture(scope="session")
def dsv32_golden(dsv32_golden_path):
    """The golden (dsv32.Golden) of --dsv32-golden; a bad file is an error naming it."""
    import dsv32
    return dsv32.read_golden(dsv32_golden_path)


@pytest.fixture
def dsv32_check(dsv32_golden, dsv32_mode, dsv32_device):
    """check(layer): runs the layer (a torch module, or a callable of (golden, device) making
    one) over the golden's steps in this test's mode and fails the test with the judge's first
    failing stage. Returns the Verdict."""
    torch = pytest.importorskip("torch", reason="dsv32.torch needs torch")
    import dsv32.torch as dt
    if dsv32_mode != "eager" and not (dsv32_device.startswith("cuda") and
                                      torch.cuda.is_available()):
        pytest.skip(f"mode {dsv32_mode} captures CUDA graphs: no CUDA device here "
                    f"(device {dsv32_device})")

    def check(layer, **kwargs):
        if not isinstance(layer, torch.nn.Module) and callable(layer):
            layer = layer(dsv32_golden, dsv32_device)
        verdict = dt.check(layer, dsv32_golden, dsv32_mode, dsv32_device, **kwargs)
        if not verdict.passed:
            pytest.fail(dt.failure_text(verdict), pytrace=False)
        return verdict
    return check
