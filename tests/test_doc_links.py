"""Every relative link in README.md and docs/**/*.md points at a file that exists (moved files leave no dead
links). Links to the web and to anchors in the same page are not checked."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(text: str) -> list[str]:
    """The relative link targets of a markdown text, without their #anchors (code spans and blocks skipped)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def dead_links(repo: Path = REPO) -> list[str]:
    pages = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    return [f"{page.relative_to(repo)}: {target}" for page in pages
            for target in relative_links(page.read_text(encoding="utf-8"))
            if not (page.parent / target).exists()]


def test_relative_links_in_readme_and_docs_resolve():
    assert not dead_links(), dead_links()


def test_a_dead_link_is_found(tmp_path):
    (tmp_path / "docs" / "experiments").mkdir(parents=True)
    (tmp_path / "docs" / "guide.md").write_text("x")
    (tmp_path / "README.md").write_text("[guide](docs/guide.md) [web](https://example.com) [top](#top) "
                                        "`[not a link](nowhere.md)` ![plot](docs/gone.png)")
    (tmp_path / "docs" / "experiments" / "a.md").write_text("[up](../guide.md#part) [moved](../../bench/x.json)")
    assert dead_links(tmp_path) == ["README.md: docs/gone.png", "docs/experiments/a.md: ../../bench/x.json"]


def test_every_bench_tool_and_experiment_is_indexed():
    """bench/README.md documents every maintained tool, experiments/README.md every experiment script."""
    for folder, patterns in (("bench", ("*.py", "*.sh")), ("experiments", ("*.py",))):
        index = (REPO / folder / "README.md").read_text(encoding="utf-8")
        scripts = sorted(p.name for pattern in patterns for p in (REPO / folder).glob(pattern))
        assert scripts and not [s for s in scripts if f"`{s}`" not in index], (folder, scripts)
