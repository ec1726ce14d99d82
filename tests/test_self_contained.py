"""The repository is self-contained: no code, test or document points outside it for data, specs or the paper
(issue 14: a clone elsewhere has no ``../shared``), and the files that replaced those pointers are here."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", "runs", ".git", "__pycache__", ".pytest_cache", ".model", ".whl", "build", "dist"}
# A path into the sibling folder the project was first built next to.
OUTSIDE = re.compile(r"(\.\./shared|/work/shared|shared/(reference|specs|paper))")


def _files():
    for p in ROOT.rglob("*"):
        if p.is_file() and p.suffix in (".py", ".md", ".sh", ".toml") and not SKIP & set(p.relative_to(ROOT).parts):
            yield p


def test_nothing_points_outside_the_repository():
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _files()
        if p.name != "test_self_contained.py"
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert hits == []


def test_reference_data_and_spec_are_in_the_repository():
    ref = json.loads((ROOT / "tests" / "data" / "meltingpot_visible.json").read_text())
    assert set(ref["games"]) == {"clean_up", "commons_harvest__open"}
    assert ref["games"]["clean_up"]["sets"]["A_random_visible"]["aggregates"]["n_episodes"] == 8
    spec = (ROOT / "docs" / "environments.md").read_text()
    assert spec.startswith("# Environment specification: Clean Up, Commons Harvest (Open), Overcooked AA / FC")
    readme = (ROOT / "README.md").read_text()
    for target in ("docs/environments.md", "tests/data/meltingpot_visible.json"):
        assert f"]({target})" in readme and (ROOT / target).exists()
