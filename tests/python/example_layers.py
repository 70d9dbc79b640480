"""The layers of python/examples (user-facing scripts, not part of the installed package) loaded
as modules from their files, for the tests of this folder: `load("torch_layer").Stack`."""
import importlib.util
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "python", "examples")


def load(name):
    """python/examples/NAME.py as the module NAME (loaded once)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
