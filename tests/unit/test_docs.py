"""The repository's documents and the references to them (docs/design.md §5).

* Nothing refers to a document outside the repository: the old design notes (``DESIGN`` +
  ``.md``), a sibling checkout (``../``), machine paths, or the numbered pull-request threads
  the notes came with. Their content lives in docs/design.md and docs/performance-log.md.
* Every ``docs/design.md §N`` reference names a section of docs/design.md (and every
  ``invariant N`` after ``§3`` one of its invariants); every ``docs/performance-log.md
  [topic]`` reference an entry of the log; every relative link of a document a file (and
  heading) that exists.
* No comment in csrc carries a dated measurement: those belong in docs/performance-log.md
  (docs/design.md §8).
* Every reference to a NOTE names one that is written down somewhere (``NOTE [name]:`` or
  ``NOTE [name] (...)``), so that renaming or deleting a NOTE cannot leave its readers behind.
* A Python module of the package, the benchmarks, the examples or the scripts that runs past
  LONG_MODULE_LINES lines says at the end of its docstring why it stays one file
  (``One file: ...``); split it otherwise.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
PERF_LOG = ROOT / "docs" / "performance-log.md"

# Spelled in pieces so that this file does not match its own patterns.
OLD_DESIGN = "DESIGN" + ".md"
SEEDS = "shared/" + "seeds"
FORBIDDEN = {
    "old design notes": re.compile(re.escape(OLD_DESIGN)),
    "paths outside the repository": re.compile(
        r"(?:^|[\s\"'(\[`=:])\.\./[A-Za-z_]|(?<![\w.])/(?:work|home|root|mnt)/\w|" + SEEDS,
        re.M,
    ),
    "numbered seed threads": re.compile(
        r"\bseed[ -]?(?:discussion|document)s?\b|\bseed[ -]?0\d\d\b", re.IGNORECASE
    ),
}

# Files that still refer to the old design notes or to numbered seed threads because others were
# editing them when the references were moved: THIS LIST MUST SHRINK TO EMPTY. Update a file's
# references (to docs/design.md §N, "docs/design.md §3, invariant N", or a description of the
# bug instead of a seed number), then delete its line here; test_allow_list_is_current fails
# until the line is gone.
ALLOWED: dict[str, set[str]] = {
    "old design notes": set(),
    "paths outside the repository": set(),
    "numbered seed threads": set(),
}
# csrc files whose comments still hold dated measurements (to be moved to the performance
# log): empty, and it stays so.
DATED_ALLOWED: set[str] = set()

TEXT_SUFFIXES = {
    ".py",
    ".h",
    ".cpp",
    ".cu",
    ".cuh",
    ".md",
    ".sh",
    ".txt",
    ".toml",
    ".cmake",
    ".json",
    "",
}
SKIP_DIRS = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"}


def _files() -> list[str]:
    """The repository's files (git's list where there is one), relative to ROOT."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        names = out.split("\n")
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
        ]
    return sorted(n for n in names if n and (ROOT / n).is_file())


def _text(name: str) -> str | None:
    path = ROOT / name
    if path.suffix not in TEXT_SUFFIXES:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def _joined(text: str) -> str:
    """Text with comment line breaks removed, so a reference split over two lines reads whole."""
    return re.sub(r"\s*\n\s*(?://+|#+|\*)?\s*", " ", text)


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return {n: t for n in _files() if (t := _text(n)) is not None}


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _design_sections() -> set[str]:
    text = DESIGN.read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M))


def _design_invariants() -> set[str]:
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("\n## 3. ", 1)[1].split("\n## 4. ", 1)[0]
    return set(re.findall(r"^\| (\d+) \| \*\*", section, re.M))


def _log_topics() -> set[str]:
    return set(re.findall(r"^### \[([^\]]+)\]", PERF_LOG.read_text(encoding="utf-8"), re.M))


@pytest.mark.parametrize("what", list(FORBIDDEN))
def test_no_references_outside_the_repository(texts: dict[str, str], what: str) -> None:
    found = {n for n, t in texts.items() if FORBIDDEN[what].search(t)}
    unexpected = sorted(found - ALLOWED[what])
    lines = [
        f"{n}:{i}: {line.strip()}"
        for n in unexpected
        for i, line in enumerate(texts[n].splitlines(), 1)
        if FORBIDDEN[what].search(line)
    ]
    assert not unexpected, f"{what} referred to in:\n" + "\n".join(lines or unexpected)


@pytest.mark.parametrize("what", list(FORBIDDEN))
def test_allow_list_is_current(texts: dict[str, str], what: str) -> None:
    """An allow-listed file that no longer needs its entry must leave the list."""
    done = sorted(n for n in ALLOWED[what] if not FORBIDDEN[what].search(texts.get(n, "")))
    assert not done, f"no longer refer to {what}; delete them from ALLOWED: {done}"


def test_design_references_name_existing_sections(texts: dict[str, str]) -> None:
    sections = _design_sections()
    invariants = _design_invariants()
    assert {str(n) for n in range(1, 11)} <= sections, sorted(sections)
    assert invariants == {str(n) for n in range(1, 9)}, sorted(invariants)
    ref = re.compile(
        r"(?:docs/)?design\.md\s*§(\d+(?:\.\d+)?)(?:\s*-\s*§(\d+(?:\.\d+)?))?"
        r"(?:,\s*invariants?\s+(\d+(?:,\s*\d+)*))?"
    )
    bad = []
    for name, text in texts.items():
        for m in ref.finditer(_joined(text)):
            for sec in filter(None, m.group(1, 2)):
                if sec not in sections:
                    bad.append(f"{name}: {m.group(0)!r}: no section {sec}")
            if m.group(3) and m.group(1) != "3":
                bad.append(f"{name}: {m.group(0)!r}: invariants are in §3")
            for inv in re.findall(r"\d+", m.group(3) or ""):
                if inv not in invariants:
                    bad.append(f"{name}: {m.group(0)!r}: no invariant {inv}")
    own = re.findall(r"§(\d+(?:\.\d+)?)", DESIGN.read_text(encoding="utf-8"))
    bad += [f"docs/design.md: §{s}: no such section" for s in own if s not in sections]
    assert not bad, "\n".join(bad)


def test_performance_log_references_name_existing_entries(texts: dict[str, str]) -> None:
    topics = _log_topics()
    ref = re.compile(r"performance-log\.md\s*\[([^\]]+)\]")
    bad = [
        f"{name}: [{m.group(1)}]"
        for name, text in texts.items()
        for m in ref.finditer(_joined(text))
        if m.group(1) not in topics and m.group(1) != "topic"  # "[topic]": the form itself
    ]
    assert not bad, "no such entry in docs/performance-log.md:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md", "docs/performance-log.md"])
def test_document_links_resolve(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = (ROOT / doc).parent / file if file else ROOT / doc
        if not path.resolve().is_relative_to(ROOT) or not path.exists():
            bad.append(f"{target}: no such file")
            continue
        if anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            if anchor not in {_slug(h) for h in headings}:
                bad.append(f"{target}: no such heading")
    assert not bad, f"{doc}:\n" + "\n".join(bad)


def test_no_dated_measurements_in_csrc_comments(texts: dict[str, str]) -> None:
    date = re.compile(r"\b20\d\d-\d\d\b")
    found = {
        n
        for n, t in texts.items()
        if n.startswith("csrc/")
        and any(date.search(line) for line in t.splitlines() if line.lstrip().startswith("//"))
    }
    unexpected = sorted(found - DATED_ALLOWED)
    assert not unexpected, f"dated measurements in comments (move them to the log): {unexpected}"
    done = sorted(DATED_ALLOWED - found)
    assert not done, f"no dated measurements left; delete them from DATED_ALLOWED: {done}"


# A NOTE is written down as "NOTE [name]:" or "NOTE [name] (...)"; every other mention of it
# refers to it. The performance log quotes old comments and is neither.
NOTE_REF = re.compile(r"NOTE \[([^\]\n]+)\]")
NOTE_DEF = re.compile(r"NOTE \[([^\]\n]+)\](?::| \()")
NOTE_PLACEHOLDERS = {"topic", "<op> layout", "<op> schedule"}  # the forms, in the documents


def _note_text(text: str) -> str:
    """_joined, with Python's adjacent string literals joined too (a name split over two)."""
    return _joined(re.sub(r"\"\s*\n\s*\"", "", text))


def test_note_references_name_existing_notes(texts: dict[str, str]) -> None:
    notes = {n: _note_text(t) for n, t in texts.items() if n != "docs/performance-log.md"}
    defined = {m.group(1) for t in notes.values() for m in NOTE_DEF.finditer(t)}
    bad = sorted(
        {
            f"{name}: [{m.group(1)}]"
            for name, text in notes.items()
            for m in NOTE_REF.finditer(text)
            if m.group(1) not in defined and m.group(1) not in NOTE_PLACEHOLDERS
        }
    )
    assert not bad, "references to a NOTE that is written down nowhere:\n" + "\n".join(bad)


LONG_MODULE_LINES = 600
LONG_MODULE_DIRS = ("overlap/", "benchmarks/", "examples/", "scripts/")
ONE_FILE = "One file:"


def test_long_modules_say_why_they_stay_one_file(texts: dict[str, str]) -> None:
    bad = []
    for name, text in sorted(texts.items()):
        if not name.endswith(".py") or not name.startswith(LONG_MODULE_DIRS):
            continue
        lines = len(text.splitlines())
        if lines <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if ONE_FILE not in doc:
            bad.append(f"{name}: {lines} lines")
    assert not bad, (
        f"modules over {LONG_MODULE_LINES} lines without a reason in their docstring "
        f"('{ONE_FILE} ...' at its end: why it stays one file), or split them:\n" + "\n".join(bad)
    )


def test_no_dated_measurements_in_python_sources(texts: dict[str, str]) -> None:
    """The package, the benchmarks, the examples and the scripts keep no dated record either:
    docstrings and comments say what a knob does and why; the numbers live in the log."""
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    roots = ("overlap/", "benchmarks/", "examples/", "scripts/")
    found = sorted(
        n for n, t in texts.items() if n.endswith(".py") and n.startswith(roots) and date.search(t)
    )
    assert not found, f"dated records in Python sources (move them to the log): {found}"
