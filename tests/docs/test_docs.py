"""The documentation: the API reference builds strictly from the docstrings, and every relative
link of the README, the guides and the benchmarks' README leads to a file and a heading that
exist (the docs' equivalent of a strict build)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / ".ci" / "api_reference.py"
PAGES = [
    REPO / "README.md",
    REPO / "notebooks" / "README.md",
    REPO / "benchmarks" / "README.md",
    *sorted((REPO / "notebooks" / "guides").glob("*.md")),
]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def build(output: Path, prelude: str = "") -> subprocess.CompletedProcess:
    """Run the build script as the docs say, after ``prelude`` (code run in the same process)."""
    code = (
        f"import runpy, sys\n{prelude}\n"
        f"sys.argv = [{str(BUILD)!r}, {str(output)!r}]\n"
        f"runpy.run_path({str(BUILD)!r}, run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO
    )


def test_the_api_reference_documents_every_public_name(tmp_path: Path):
    import nbtrain

    done = build(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "nbtrain.html").read_text()
    for name in nbtrain.__all__:
        assert f'id="{name}"' in page, f"{name} is not in the API reference"
    # The docstrings themselves, rendered (double backticks become code).
    assert "Run <code>function(*args, **kwargs)</code> on <code>num_processes</code>" in page
    assert (tmp_path / "index.html").is_file()


def test_the_api_reference_fails_on_a_public_name_without_a_docstring(tmp_path: Path):
    prelude = textwrap.dedent("""
        import nbtrain
        def undocumented(): pass
        nbtrain.undocumented = undocumented
        nbtrain.__all__.append("undocumented")
    """)
    done = build(tmp_path, prelude)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nbtrain.undocumented has no docstring" in done.stderr, done.stderr[-3000:]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path):
    assert not broken_links(page), f"{page.relative_to(REPO)}: {broken_links(page)}"


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other\n\n## Stop and resume\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#stop-and-resume) [ok](#page) [web](https://example.org)\n"
        "[gone](missing.md) [no heading](other.md#nope)\n```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md (no such file)",
        "other.md#nope (no heading #nope in other.md)",
    ]


def test_every_guide_is_listed_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for guide in (REPO / "notebooks" / "guides").glob("*.md"):
        assert f"(notebooks/guides/{guide.name})" in readme, f"README does not link {guide.name}"
