"""The docs cite only what exists: links, sections and docs/architecture.md's module, file and code names."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
ARCHITECTURE = REPO / "docs" / "architecture.md"
# Never the project's own source: installed packages, git's store, build and run-time output.
SKIPPED_DIRS = {".venv", ".git", "node_modules", "__pycache__", "var", ".ruff_cache", ".pytest_cache"}
# Files whose words count as "the code" for a name cited in docs/architecture.md (tests and docs do not).
CODE_SUFFIXES = {".py", ".yml", ".yaml", ".toml", ".cfg", ".ini", ".html", ".js", ".sh", ".conf", ".txt"}
CODE_NAMES = {"Makefile", "Dockerfile", ".env.example"}
# Files that may cite a doc's section by its title: docs, code comments, configuration.
CITING_SUFFIXES = CODE_SUFFIXES | {".md"}

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# A path that climbs out of the repository: `../x`, not the ellipsis of `.../hold/`.
CLIMBING_PATH = re.compile(r"(?<![\w.])\.\./[\w.-]")
# `docs/performance.md, "Moves per round"`: a section cited by its title (may wrap over lines).
SECTION_CITATION = re.compile(r"\b((?:docs/)?[a-z0-9_-]+\.md),?\s+(?:section\s+)?\"([^\"]{2,200})\"")
FILE_NAME = re.compile(r"^[\w.-]+\.(py|md|yml|yaml|toml|txt|cfg|ini|html|js|css|csv|json|sh|conf)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
WORD = re.compile(r"[A-Za-z_]\w*")


def project_files(suffixes: set[str], names: frozenset[str] = frozenset(), skip: tuple[str, ...] = ()):
    """The repository's own files with these suffixes or names, outside SKIPPED_DIRS and `skip`."""
    for path in sorted(REPO.rglob("*")):
        relative = path.relative_to(REPO)
        if set(relative.parts) & SKIPPED_DIRS or relative.as_posix().startswith(skip) or not path.is_file():
            continue
        if path.suffix in suffixes or path.name in names:
            yield path


def prose(text: str) -> str:
    """Markdown without fenced code blocks and code spans: where a link is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def headings(doc: Path) -> tuple[str, ...]:
    """The doc's headings as written (code blocks excluded)."""
    text = FENCE.sub("", doc.read_text())
    return tuple(m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M))


def anchors(doc: Path) -> set[str]:
    """Every anchor GitHub gives the doc's headings, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(doc):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def plain(text: str) -> str:
    """A title for comparison: no markup, no comment markers where it wrapped, one space, lower case."""
    text = re.sub(r"\s*\n\s*(#\s*)?", " ", text)
    return re.sub(r"\s+", " ", re.sub(r"[`*]", "", text)).strip().lower()


def doc_ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(REPO).as_posix() for p in paths]


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids(DOCS))
def test_relative_links_resolve_inside_the_repository(doc):
    """Each relative link names a file or folder in the repository, and its #anchor a heading there."""
    broken = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path_part = path_part.split("?")[0]
        resolved = REPO / path_part.lstrip("/") if path_part.startswith("/") else doc.parent / path_part
        resolved = resolved.resolve() if path_part else doc
        if not resolved.is_relative_to(REPO):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids(DOCS))
def test_no_path_climbs_out_of_the_repository(doc):
    """No doc sends the reader to `../something`: whatever it cites must be in the repository."""
    lines = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if CLIMBING_PATH.search(line)
    ]
    assert not lines, f"{doc.relative_to(REPO)} cites paths outside the repository: {lines}"


@cache
def repository_path_pattern() -> re.Pattern[str]:
    """A path that starts at one of the repository's top-level folders: `scheduler_app/services/rounds.py`."""
    tops = sorted(
        p.name
        for p in REPO.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name not in SKIPPED_DIRS
    )
    folders = "|".join(map(re.escape, tops))
    return re.compile(rf"(?<![\w./-])((?:{folders})/[\w./-]*[\w/])")


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids(DOCS))
def test_repository_paths_named_in_a_doc_exist(doc):
    """A path from a top-level folder (`cluster_app/...`, `tests/...`), code or prose, names what is there."""
    missing = [
        f"line {n}: {match.group(1).rstrip('.')}"
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        for match in repository_path_pattern().finditer(line)
        if not (REPO / match.group(1).rstrip(".")).exists()
    ]
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"


def section_citations():
    """(citing file, doc, title) for every `docs/x.md, "Title"` in the docs, the code and its config."""
    found = []
    for path in project_files(CITING_SUFFIXES, frozenset(CODE_NAMES), skip=("tests/data",)):
        if path == Path(__file__).resolve():
            continue
        for match in SECTION_CITATION.finditer(path.read_text(errors="replace")):
            name, title = match.groups()
            doc = REPO / name if "/" in name or name == "README.md" else REPO / "docs" / name
            if path == doc and name == "README.md":
                continue
            found.append((path.relative_to(REPO).as_posix(), doc, plain(title)))
    return found


def test_section_citations_name_a_heading_of_that_doc():
    """`docs/performance.md, "Moves per round"` in a comment or a doc: that doc has such a heading."""
    citations = section_citations()
    assert citations, "the pattern found no citation at all: it no longer matches how sections are cited"
    broken = []
    for citing, doc, title in citations:
        if not doc.exists():
            broken.append(f"{citing}: {doc.relative_to(REPO)} does not exist")
        elif not any(title in plain(heading) for heading in headings(doc)):
            broken.append(f'{citing}: {doc.relative_to(REPO)} has no heading "{title}"')
    assert not broken, "\n".join(broken)


def architecture_names() -> list[str]:
    """Every code span of docs/architecture.md, in order, once each."""
    text = FENCE.sub("", ARCHITECTURE.read_text())
    return list(dict.fromkeys(span.strip("`").strip() for span in CODE_SPAN.findall(text)))


@cache
def code_words() -> frozenset[str]:
    """Every identifier-like word in the project's code and configuration (tests and docs excluded)."""
    words: set[str] = set()
    for path in project_files(CODE_SUFFIXES, frozenset(CODE_NAMES), skip=("tests/", "docs/")):
        words.update(WORD.findall(path.read_text(errors="replace")))
    return frozenset(words)


@cache
def top_level_packages() -> frozenset[str]:
    return frozenset(p.parent.name for p in REPO.glob("*/__init__.py"))


@cache
def module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def defined_names(body: list[ast.stmt]) -> set[str]:
    """Names bound by these statements: functions, classes, assignments, imports (re-exports)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            names |= defined_names(node.body + getattr(node, "orelse", []))
    return names


def module_file(dotted: str) -> Path | None:
    """The repository file of module `dotted` (a package's __init__.py), if it is one."""
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def project_classes() -> dict[str, list[ast.ClassDef]]:
    """Every class defined in the project's Python (tests excluded), by name."""
    classes: dict[str, list[ast.ClassDef]] = {}
    for path in project_files({".py"}, skip=("tests/", "docs/")):
        for node in ast.walk(module_tree(path)):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)
    return classes


def dotted_problem(name: str) -> str | None:
    """Why `package.module.attr` or `Class.attr` names nothing in the code, or None if it does."""
    parts = name.split(".")
    if parts[0] in top_level_packages():
        for cut in range(len(parts), 0, -1):
            path = module_file(".".join(parts[:cut]))
            if path is None:
                continue
            rest = parts[cut:]
            if not rest:
                return None
            if rest[0] not in defined_names(module_tree(path).body):
                return f"{'.'.join(parts[:cut])} defines no {rest[0]}"
            return None
        return "no such module"
    if parts[0] in project_classes():
        bodies = [defined_names(node.body) for node in project_classes()[parts[0]]]
        if len(parts) == 2 and not any(parts[1] in body for body in bodies):
            return f"class {parts[0]} has no attribute {parts[1]} in its body"
        return None
    return "neither a module path from the repository's root nor a class of the project: write it in full"


def architecture_problem(name: str) -> str | None:
    """Why a code span of docs/architecture.md names nothing in the repository, or None if it does."""
    if name.startswith("python -m "):
        module = name.split()[2]
        return None if module_file(module) else f"no module {module}"
    if re.fullmatch(r"[\w./-]+", name) and "/" in name and not name.startswith("/"):
        return None if (REPO / name).exists() else "no such file or folder in the repository"
    if FILE_NAME.match(name):
        return None if (REPO / name).exists() else "not at the repository's root: give its path from there"
    call = re.match(r"^([\w.]+)\(", name)
    if call:
        name = call.group(1)
    if DOTTED.match(name):
        return dotted_problem(name)
    name = name.split("=")[0]
    if IDENTIFIER.match(name) and ("_" in name.strip("_") or re.search(r"[a-z][A-Z]|^[A-Z][a-z]", name)):
        return None if name in code_words() else "no such name in the project's code"
    return None  # prose in code type: SQL, a setting's value, an HTTP call, a shell command


def test_architecture_cites_only_what_the_code_has():
    """docs/architecture.md's paths, modules, classes and names exist in the repository's code."""
    names = architecture_names()
    assert len(names) > 50, "the page's code spans were not found"
    problems = [f"`{name}`: {why}" for name in names if (why := architecture_problem(name))]
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("shared/DESIGN.md", "no such file"),
        ("scheduler_app/services/no_such_module.py", "no such file"),
        ("scheduler_app.services.no_such_module", "defines no"),
        ("scheduler_app.core.engine.no_such_function", "defines no"),
        ("engine.schedule_round", "write it in full"),
        ("types.py", "not at the repository's root"),
        ("Job.no_such_field", "no attribute"),
        ("no_such_function_anywhere", "no such name"),
        ("python -m bench.no_such_bench", "no module"),
    ],
)
def test_the_architecture_check_refuses_a_name_the_code_lacks(name, why):
    """The check is not vacuous: each kind of citation, misspelt, is refused."""
    problem = architecture_problem(name)
    assert problem is not None and why in problem, problem


@pytest.mark.parametrize(
    "name",
    [
        "scheduler_app/core/engine.py",
        "scheduler_app.core.engine.schedule_round",
        "Job.run_as",
        "CELERY_TASK_ROUTES",
        "python -m bench.core_round",
        "docker-compose.yml",
    ],
)
def test_the_architecture_check_accepts_what_exists(name):
    assert architecture_problem(name) is None


def test_the_path_check_finds_repository_paths_only():
    """Paths from the repository's folders are checked; the reference's own files and URL paths are not."""
    text = "see scheduler_app/services/rounds.py, events/job.py, api/qos.json and `POST .../hold/`."
    assert [m.group(1) for m in repository_path_pattern().finditer(text)] == [
        "scheduler_app/services/rounds.py"
    ]
