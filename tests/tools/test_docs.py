#!/usr/bin/python3
"""Every Markdown page the README, docs/ and the Python package name exists in the repository (a
user's clone has nothing beside it): `docs/X.md` and `python/...` as paths from the root, a bare
`X.md` in docs/ or docs/spec/ (the contract: MATH.md, GOLDEN.md, TESTING.md, BOUNDARIES.md).

usage: test_docs.py REPO_ROOT"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish  # noqa: E402

ROOT = sys.argv[1]
SOURCES = ([os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                         recursive=True)
           + glob.glob(os.path.join(ROOT, "python", "**", "*.py"), recursive=True))
REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][\w-]*\.md)\b")


def resolves(name):
    if "/" in name:
        return os.path.exists(os.path.join(ROOT, name))
    return any(os.path.exists(os.path.join(ROOT, d, name)) for d in ("", "docs", "docs/spec"))


missing = {}
for path in SOURCES:
    with open(path, encoding="utf-8") as f:
        for name in set(REF.findall(f.read())):
            if not resolves(name):
                missing.setdefault(os.path.relpath(path, ROOT), []).append(name)
check(f"every page named in {len(SOURCES)} files exists in the repository", not missing, missing)
for spec in ("MATH", "GOLDEN", "TESTING", "BOUNDARIES"):
    check(f"the contract's {spec}.md is in docs/spec/",
          os.path.exists(os.path.join(ROOT, "docs", "spec", spec + ".md")))
finish()
