"""Every Markdown page the README, docs/ and the Python package name exists in the repository (a
user's clone has nothing beside it): `docs/X.md` and `python/...` as paths from the root, a bare
`X.md` in docs/ or docs/spec/ (the contract: MATH.md, GOLDEN.md, TESTING.md, BOUNDARIES.md).

    python3 -m pytest tests/tools/test_docs.py          (ctest: Docs.EveryPageNamedExists)"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ([os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                         recursive=True)
           + glob.glob(os.path.join(ROOT, "python", "**", "*.py"), recursive=True))
REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][\w-]*\.md)\b")


def resolves(name):
    if "/" in name:
        return os.path.exists(os.path.join(ROOT, name))
    return any(os.path.exists(os.path.join(ROOT, d, name)) for d in ("", "docs", "docs/spec"))


def test_every_page_named_exists_in_the_repository():
    missing = {}
    for path in SOURCES:
        with open(path, encoding="utf-8") as f:
            for name in set(REF.findall(f.read())):
                if not resolves(name):
                    missing.setdefault(os.path.relpath(path, ROOT), []).append(name)
    assert len(SOURCES) > 1 and not missing, missing


@pytest.mark.parametrize("spec", ["MATH", "GOLDEN", "TESTING", "BOUNDARIES"])
def test_the_contracts_page_is_in_docs_spec(spec):
    assert os.path.exists(os.path.join(ROOT, "docs", "spec", spec + ".md"))
