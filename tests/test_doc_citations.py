"""The repository explains itself (issue 47): every `docs/<file>.md §<heading>` citation in a
tracked file resolves to a heading of that doc, no tracked file cites a document outside the
repository, docs/index.md reaches every doc, README is a front page, and docs/layout.md's Layout
names every file of h3_core and every top-level folder, and nothing that is not there."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

NUM = r"[A-Z]?\d+(?:\.\d+)*"
SECTION = rf'(?:{NUM}(?:-{NUM})?|"[^"\n]+")'
PAREN = r"(?:\s?\([^()\n]{0,64}\))?"
SEP = r"(?:,\s|\sand\s|;\s)"
CITATION = re.compile(rf"docs/(?P<file>[\w.-]+\.md)(?P<chain>\s§{SECTION}{PAREN}(?:{SEP}§{SECTION}{PAREN})*)")
# the names of the documents that live outside the repository, spelled so that this file does not cite them
OUTSIDE_NAMES = ("h3_" + "spec", "ARCHI" + "TECTURE", "field_bug" + "_cases", "shared" + "/docs", "/wo" + "rk/")
PARENT_PATH = re.compile(r"(?<![\w./])((?:\.\./)+[\w][\w./-]*)")
NAMED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)")


def tracked_texts() -> dict[str, str]:
    """Every tracked file that decodes as UTF-8: path relative to ROOT -> text."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    texts = {}
    for name in filter(None, names.stdout.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def headings(text: str) -> list[str]:
    """Markdown heading texts (without the #s), code blocks left out."""
    found, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def resolves(section: str, heads: list[str]) -> bool:
    """An id (`2.3`, `C13`) names the heading it starts; a quoted text the heading it begins."""
    if section.startswith('"'):
        return any(h.startswith(section.strip('"')) for h in heads)
    return any(re.match(re.escape(section) + r"(?:[ :]|\.\s|$)", h) for h in heads)


def bad_citations(texts: dict[str, str], docs: dict[str, list[str]]) -> tuple[int, list[str]]:
    """(number of sections cited, 'where: citation: why' for each that does not resolve)."""
    cited, bad = 0, []
    for where, text in texts.items():
        for match in CITATION.finditer(text):
            name = match["file"]
            if name not in docs:
                bad.append(f"{where}: {match[0]!r}: docs/{name} does not exist")
                continue
            for section in re.findall(rf"§({SECTION})", match["chain"]):
                ends = [section] if section.startswith('"') else section.split("-")
                for end in ends:
                    cited += 1
                    if not resolves(end, docs[name]):
                        bad.append(f"{where}: {match[0]!r}: no heading {end} in docs/{name}")
    return cited, bad


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return tracked_texts()


@pytest.fixture(scope="module")
def docs() -> dict[str, list[str]]:
    return {path.name: headings(path.read_text()) for path in sorted((ROOT / "docs").glob("*.md"))}


def test_the_checker_reads_ids_ranges_lists_and_quoted_headings():
    docs = {
        "model.md": ["2.1 One request's rows", "2.3 RoPE coordinates", "4 Text encoder"],
        "ops.md": ["Threat model"],
    }
    d = "docs" + "/"  # spelled so that this file's own text holds no citation
    text = (
        f'see {d}model.md §2.1-2.3, §4 (the VAEs) and §2.3; {d}ops.md §"Threat model". '
        f'Wrong: {d}model.md §2.2, {d}model.md §4.1, {d}ops.md §"Threat", {d}none.md §1.'
    )
    cited, bad = bad_citations({"x.py": text}, docs)
    assert cited == 8
    assert bad == [
        f"x.py: '{d}model.md §2.2': no heading 2.2 in {d}model.md",
        f"x.py: '{d}model.md §4.1': no heading 4.1 in {d}model.md",
        f"x.py: '{d}none.md §1': {d}none.md does not exist",
    ]
    assert not resolves("2", ["2.1 One request's rows"])  # an id names a whole heading number
    assert resolves('"Threat"', ["Threat model"])  # a quoted text its beginning


def test_every_docs_citation_resolves_to_a_heading(texts, docs):
    cited, bad = bad_citations(texts, docs)
    assert bad == []
    assert cited >= 100  # the code's citations of docs/model.md alone are more than that


def test_no_tracked_file_cites_a_document_outside_the_repository(texts):
    found = []
    for where, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{where}:{number}: {name}" for name in OUTSIDE_NAMES if name in line]
            for path in PARENT_PATH.findall(line):
                from_file = (ROOT / where).parent / path
                if not (from_file.resolve().is_relative_to(ROOT) or (ROOT / path).resolve().is_relative_to(ROOT)):
                    found.append(f"{where}:{number}: {path}")
    assert found == []


def test_docs_index_reaches_every_doc(texts):
    docs = {path.name for path in (ROOT / "docs").glob("*.md")}
    assert "docs/index.md" in LINK.findall(texts["README.md"])
    reached, todo = set(), ["index.md"]
    while todo:
        name = todo.pop()
        if name in reached or name not in docs:
            continue
        reached.add(name)
        todo += [Path(link).name for link in LINK.findall((ROOT / "docs" / name).read_text()) if "/" not in link]
    assert sorted(docs - reached) == []


def test_readme_is_a_front_page_and_keeps_the_ci_test_command(texts):
    readme = texts["README.md"]
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert texts[".ci/run"].strip().endswith("make test")
    assert re.search(r"^make test\b", readme, re.M)  # the command .ci/run runs, in a code block


def test_tests_named_in_the_docs_exist(texts):
    named, missing = 0, []
    for where, text in texts.items():
        if not where.endswith(".md"):
            continue
        for path, name in NAMED_TEST.findall(text):
            named += 1
            if path not in texts or not re.search(rf"^(?:async )?def {name}\(", texts[path], re.M):
                missing.append(f"{where}: {path}::{name}")
    assert missing == []
    assert named >= 30  # docs/failure_classes.md names a test for every class


def layout_block() -> str:
    text = (ROOT / "docs" / "layout.md").read_text()
    return re.search(r"^```\n(.*?)^```", text, re.M | re.S)[1]


def layout_paths() -> set[str]:
    """The paths docs/layout.md's Layout names: a top-level entry at column 0, a module or package
    of h3_core indented under it ('  name.py', '  model/'), and 'a.py, b.py' lists after them."""
    paths, parent = set(), ""
    for line in layout_block().splitlines():
        match = re.match(r"^( *)([\w.-]+/?)", line)
        if not match or len(match[1]) > 2:
            continue
        if match[1] == "":
            parent = match[2] if match[2].endswith("/") else ""
            paths.add(match[2].rstrip("/"))
        elif parent:
            paths.add(parent + match[2].rstrip("/"))
    return paths


def test_layout_names_what_the_tree_holds(texts):
    named = layout_paths()
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
    top = {name.split("/")[0] for name in texts if not name.startswith(".")}
    core = set()  # h3_core's own modules and its packages, as the Layout names them
    for name in texts:
        parts = name.split("/")
        if parts[0] == "h3_core" and len(parts) == 2 and parts[1] != "__init__.py":
            core.add(name)
        elif parts[0] == "h3_core" and len(parts) > 2:
            core.add("/".join(parts[:2]))
    modules = {name for name in texts if name.startswith("h3_core/") and name.endswith(".py")}
    block = layout_block()
    unnamed_modules = sorted(m for m in modules if Path(m).name != "__init__.py" and Path(m).name not in block)
    assert sorted(top - named) == []
    assert sorted(core - named) == []
    assert unnamed_modules == []
