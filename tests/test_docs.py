"""The docs stay true to the tree: README.md is one page, docs/ is complete and every link works.

Fast and rank-free: these tests read files (and import two registries). Each check compares
the docs with what the code holds now, so a renamed module, a new Note, a moved import path or
a broken link fails here, naming what to fix.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MARKDOWN = [README, ROOT / "CHANGELOG.md", *PAGES]

LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
NOTE_REF = re.compile(r"Note \[(vlmcp [^\]]+)\]")
NOTE_UNDERLINE = re.compile(r"\s*[-=~]{5,}\s*")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (code spans kept)."""
    return FENCE.sub("", text)


def _links(path: Path) -> list[str]:
    """Every link target of a Markdown file, outside code (images included)."""
    text = CODE_SPAN.sub(lambda m: m.group(0).replace("[", "").replace("]", "").replace("(", ""),
                         _prose(path.read_text()))
    return [target for _, target in LINK.findall(text)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _section(text: str, heading: str) -> str:
    """The body of the section ``heading`` (up to the next heading of the same or a higher level)."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines))
                if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def _modules() -> list[str]:
    """Every module of the package, relative to ``vlmcp/``, but ``__init__.py`` and ``__main__.py``."""
    return sorted(str(p.relative_to(ROOT / "vlmcp")) for p in (ROOT / "vlmcp").rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)


def _defined_notes() -> dict[str, str]:
    """``Note [vlmcp ...]`` headers in the code (alone on a line, underlined) -> the defining file."""
    notes: dict[str, str] = {}
    for path in sorted((ROOT / "vlmcp").rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            m = re.fullmatch(r'\s*(?:"""|r""")?Note \[(vlmcp [^\]]+)\]\s*', line)
            if m and NOTE_UNDERLINE.fullmatch(lines[i + 1]):
                assert m.group(1) not in notes, f"Note [{m.group(1)}] is defined twice"
                notes[m.group(1)] = str(path.relative_to(ROOT))
    return notes


def _joined(text: str) -> str:
    """Wrapped lines joined (comment markers dropped), so a Note name split over lines reads whole."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def test_readme_is_one_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the manual belongs in docs/"


def test_every_docs_page_is_linked_from_the_readme():
    assert PAGES, "docs/ holds no pages"
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _links(README) if not t.startswith("#")}
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert not missing, f"docs pages the README's map does not link: {missing}"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in MARKDOWN:
        for target in _links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_design_page_indexes_every_note_where_it_is_defined():
    defined = _defined_notes()
    assert len(defined) >= 20, f"found only {len(defined)} Note definitions: did their form change?"
    index = _section((DOCS / "design.md").read_text(), "## Index of notes")
    rows = {}
    for line in index.splitlines():
        m = re.match(r"\|\s*Note \[(vlmcp [^\]]+)\]\s*\|\s*`([^`]+)`\s*\|\s*\S", line)
        if m:
            rows[m.group(1)] = m.group(2)
    missing = sorted(set(defined) - set(rows))
    stale = sorted(set(rows) - set(defined))
    moved = sorted(f"{n}: index says {rows[n]}, defined in {defined[n]}" for n in set(rows) & set(defined)
                   if rows[n] != defined[n])
    assert not missing, f"Notes missing from docs/design.md's index: {missing}"
    assert not stale, f"docs/design.md indexes Notes the code no longer defines: {stale}"
    assert not moved, "Notes indexed under the wrong file:\n" + "\n".join(moved)


def test_every_note_the_code_and_the_docs_cite_exists():
    defined = set(_defined_notes())
    dangling = []
    for path in sorted((ROOT / "vlmcp").rglob("*.py")):
        for name in set(NOTE_REF.findall(_joined(path.read_text()))) - defined:
            dangling.append(f"{path.relative_to(ROOT)}: Note [{name}]")
    for page in MARKDOWN:
        # a `Note [vlmcp ...]` in a code span is an example, not a citation
        prose = _joined(CODE_SPAN.sub("", _prose(page.read_text())))
        for name in set(re.findall(r"\[(vlmcp [^\]]+)\](?!\()", prose)) - defined:
            dangling.append(f"{page.relative_to(ROOT)}: [{name}]")
    assert not dangling, "Notes cited but defined nowhere:\n" + "\n".join(sorted(dangling))


def test_the_code_tour_names_every_module_and_no_other():
    tour = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"`(?:vlmcp/)?([\w/]+\.py)`", tour))
    missing = [m for m in _modules() if m not in named]
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
    stale = sorted(m for m in named if "/" in m or m in ("grads.py", "launch.py", "_moved.py")
                   if not m.startswith(("tests/", "scripts/")) and not (ROOT / "vlmcp" / m).exists())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
    gone = sorted(m for m in named if m.startswith(("tests/", "scripts/")) and not (ROOT / m).exists())
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"


def test_the_quickstart_is_make_demo_and_make_test():
    quickstart = _section(README.read_text(), "## Quickstart")
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", quickstart, flags=re.S)
    assert blocks, "README's Quickstart has no command block"
    commands = [line.split("#")[0].strip() for line in blocks[0].splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == "make test", f".ci/run must end in the README's test command, not {ci[-1]!r}"


def test_the_architecture_table_lists_every_adapter_and_real_tests():
    from vlmcp.hf.adapters import supported_model_types

    table = _section(README.read_text(), "## Architectures")
    missing = [t for t in supported_model_types() if f"`{t}`" not in table]
    assert not missing, f"model types with an adapter that README's table leaves out: {missing}"
    for name in sorted(set(re.findall(r"`(test_\w+\.py)`", table))):
        assert (ROOT / "tests" / name).exists(), f"README's table cites tests/{name}, which does not exist"
    for name in sorted(set(re.findall(r"`(\w+\.py)`", table)) - set(re.findall(r"`(test_\w+\.py)`", table))):
        assert (ROOT / "vlmcp" / "hf" / "adapters" / name).exists(), f"no adapter file hf/adapters/{name}"


def _module_file(path: str) -> Path | None:
    """The file of module ``path`` (``vlmcp.a.b``) in the tree, or None."""
    base = ROOT.joinpath(*path.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _exists(path: str) -> bool:
    """``path`` is a module of the tree, or a name that a module of the tree defines or imports."""
    if _module_file(path) is not None:
        return True
    module, _, name = path.rpartition(".")
    source = _module_file(module)
    if source is None:
        return False
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return name in names


def test_the_changelog_moved_paths_are_gone_and_the_new_ones_exist():
    """Every row of the unreleased "Moved import paths" table: no old path is left in the tree (no
    alias either), and the first path of its new column is there."""
    text = (ROOT / "CHANGELOG.md").read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads and "unreleased" in heads[0], f"CHANGELOG.md opens with {heads[:1]}, not the unreleased one"
    unreleased = _section(text, f"## {heads[0]}")
    assert re.search(r"^### Added$", unreleased, re.M), "the unreleased section has no '### Added' list"
    rows = [line.split("|")[1:3] for line in _section(unreleased, "### Moved import paths").splitlines()
            if line.startswith("| `vlmcp")]
    assert len(rows) >= 28, f"the moved-paths table has {len(rows)} rows"
    left = [p for old, _ in rows for p in re.findall(r"`(vlmcp[\w.]*)`", old) if _exists(p)]
    assert not left, f"CHANGELOG.md says these paths moved, but the tree still has them: {left}"
    missing = [new for _, new in rows if not _exists(re.findall(r"`(vlmcp[\w.]*)`", new)[0])]
    assert not missing, f"CHANGELOG.md names new paths the tree does not have: {missing}"
