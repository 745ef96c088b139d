"""The documentation site (.ci/mkdocs.yml): it builds strictly from the repository's own pages
(README, tutorials with their stored outputs, guides, measurements, API reference from the
docstrings), and a broken link, anchor or reference, or an undocumented public name, fails it."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(".ci") / "mkdocs.yml"


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """The README's command, from ``root`` (a checkout), into ``site``."""
    env = {**os.environ, "PYTHONPATH": str(root), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-f", str(CONFIG), "-d", str(site)],
        capture_output=True, text=True, timeout=240, cwd=root, env=env,
    )  # fmt: skip


def first_printed_line(notebook: Path) -> str | None:
    """The first line a notebook's stored outputs printed (None if it printed nothing)."""
    for cell in json.loads(notebook.read_text())["cells"]:
        for output in cell.get("outputs", []):
            lines = "".join(output.get("text", "")).strip().splitlines()
            if output["output_type"] == "stream" and lines:
                return lines[0]
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module's tests (a strict build takes most of a minute)."""
    folder = tmp_path_factory.mktemp("site")
    done = build(REPO, folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    return folder


def test_the_site_has_every_page_and_builds_strictly(site: Path):
    tmp_path = site
    home = (tmp_path / "index.html").read_text()
    assert "Notebook-first interactive distributed training for PyTorch" in home
    # A link written for GitHub leads to the page built from its target.
    assert 'href="notebooks/guides/launching.html"' in home
    assert 'href="benchmarks/index.html#on-a-gpu"' in home
    for guide in (REPO / "notebooks" / "guides").glob("*.md"):
        assert (tmp_path / "notebooks" / "guides" / f"{guide.stem}.html").is_file(), guide.name
    measurements = (tmp_path / "benchmarks" / "index.html").read_text()
    assert "Launch round trip" in measurements

    notebooks = sorted((REPO / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 8
    for notebook in notebooks:
        page = (tmp_path / "notebooks" / f"{notebook.stem}.html").read_text()
        printed = first_printed_line(notebook)
        if printed is not None:  # the stored outputs, not a fresh run
            assert html.escape(printed, quote=False) in page, (notebook.name, printed)

    import nbtrain

    api = (tmp_path / "api.html").read_text()
    for name in set(nbtrain.__all__) - {"__version__"}:
        assert f'id="nbtrain.{name}"' in api, f"{name} is not in the API reference"
    # Methods from the Accelerator's mixins, and Accelerate's properties without docstrings.
    for member in ("backward", "save_state", "unwrap_model", "device", "is_main_process"):
        assert f'id="nbtrain.Accelerator.{member}"' in api, f"Accelerator.{member} is missing"
    # The docstrings themselves, rendered (double backticks become code).
    assert "Run <code>function(*args, **kwargs)</code> on <code>num_processes</code>" in api
    # Accelerate's utils and tracking names, and the warm ranks' handle.
    for name in (
        "utils.gather",
        "utils.LoggerType",
        "tracking.GeneralTracker",
        "kernel.warm.session.Ranks.run_cell",
        "Accelerator.progress",
    ):
        assert f'id="nbtrain.{name}"' in api, f"nbtrain.{name} is not in the API reference"
    # Parameters and what a call raises, as tables (the :param: and :raises: fields).
    launcher = api.partition('id="nbtrain.notebook_launcher"')[2].partition('id="nbtrain.')[0]
    assert "start_method" in launcher and "Raises:" in launcher and "WorkerError" in launcher


HREF = re.compile(r'\s(?:href|src)="([^"]*)"')
ANCHOR = re.compile(r'\s(?:id|name)="([^"]*)"')


def broken_links(site: Path) -> list[str]:
    """Every link of every page of the built site that leads to no file, or to no element of
    its page with the anchor's id; a URL with a scheme (https:, mailto:) is not the site's."""
    anchors: dict[Path, set[str]] = {}
    broken = []
    for page in sorted(site.rglob("*.html")):
        for link in map(html.unescape, HREF.findall(page.read_text())):
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//") or not link:
                continue
            base = site if parts.path.startswith("/") else page.parent  # 404.html: from the root
            target = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(site)} links to {link!r}"
            if not target.is_file():
                broken.append(f"{where}: no such file")
            elif parts.fragment and target.suffix == ".html":
                if target not in anchors:
                    anchors[target] = set(map(html.unescape, ANCHOR.findall(target.read_text())))
                if unquote(parts.fragment) not in anchors[target]:
                    broken.append(f"{where}: no element has that id")
    return broken


def test_every_internal_link_of_the_site_leads_somewhere(site: Path):
    # (mkdocs-jupyter's table of contents drops code spans from a notebook's headings, so a
    # heading with `code` in it gets a contents link that goes nowhere: write it without.)
    assert len(list(site.rglob("*.html"))) >= 25
    broken = broken_links(site)
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path):
    (tmp_path / "a.html").write_text(
        '<h2 id="here">x</h2><a href="#here">ok</a> <a href="b.html#there">b</a> '
        '<a href="gone.html">gone</a> <a href="#nowhere">no</a> <a href="https://x.org/">ext</a>'
    )
    (tmp_path / "b.html").write_text('<p id="elsewhere">b</p> <a href="/a.html#here">root</a>')
    assert broken_links(tmp_path) == [
        "a.html links to 'b.html#there': no element has that id",
        "a.html links to 'gone.html': no such file",
        "a.html links to '#nowhere': no element has that id",
    ]


def test_a_broken_link_anchor_reference_or_docstring_fails_the_build(tmp_path: Path):
    root = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for folder in ("nbtrain", "notebooks"):
        shutil.copytree(REPO / folder, root / folder, ignore=skip)
    for file in ("README.md", "benchmarks/README.md", ".ci/mkdocs.yml", ".ci/docs_site.py"):
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / file, root / file)
    guide = root / "notebooks" / "guides" / "debugging.md"
    guide.write_text(
        guide.read_text()
        + "\n[gone](no-such-guide.md), [no heading](launching.md#no-such-heading),"
        + " [no such name][nbtrain.no_such_name]\n"
    )
    notebook = root / "notebooks" / "01_quickstart.ipynb"
    cells = json.loads(notebook.read_text())
    cells["cells"].append(
        {"cell_type": "markdown", "id": "broken", "metadata": {},
         "source": "[gone](no-such-notebook.ipynb), [no heading](guides/fsdp.md#no-such-part)"}
    )  # fmt: skip
    notebook.write_text(json.dumps(cells))
    init = root / "nbtrain" / "__init__.py"
    init.write_text(init.read_text() + "\ndef bare(): pass\n\n__all__.append('bare')\n")

    done = build(root, tmp_path / "site")
    assert done.returncode == 1, done.stderr[-3000:]
    warnings = "\n".join(re.findall(r"WARNING.*", done.stderr))
    assert "'no-such-guide.md'" in warnings, warnings
    assert "'#no-such-heading'" in warnings, warnings
    assert "nbtrain.no_such_name" in warnings, warnings
    assert "nbtrain.bare has no docstring" in warnings, warnings
    # The same, in a notebook's Markdown cell:
    assert "'no-such-notebook.ipynb'" in warnings, warnings
    assert "guides/fsdp.md#no-such-part" in warnings, warnings


def test_every_guide_is_listed_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for guide in (REPO / "notebooks" / "guides").glob("*.md"):
        assert f"(notebooks/guides/{guide.name})" in readme, f"README does not link {guide.name}"
