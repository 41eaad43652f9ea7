"""The README and the pages in docs/ say only what is true of this checkout (serial).

Every ``python -m hpctrain`` line in a code block parses with the command's own parser and names
a net that exists; every ``$`` line of a ``console`` block runs and exits 0; every path, module,
``make`` target and link they name exists; and the site builds with Sphinx with no warning, every
cross-reference into the API resolved. A renamed flag, module or section fails here, not in a
reader's terminal.
"""

import importlib
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.cli import COMMANDS, command_module
from hpctrain.io.locations import shipped_names
from tests.test_training_app import mpiexec

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "console")
LOOP_N = "4"  # the value of $n in a `for n in …` loop of an example
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b")  # NAME, RUN_DIR, JOBNAME…: stands for a value


def code_blocks(page: Path) -> Iterator[tuple[str, int, list[str]]]:
    """(language, line number of the opening fence, lines) of each fenced block of ``page``."""
    language, start, lines = None, 0, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            if language is None:
                language, start, lines = line[3:].strip(), number, []
            else:
                yield language, start, lines
                language = None
        elif language is not None:
            lines.append(line)


def prose(page: Path) -> str:
    """``page`` without its fenced blocks."""
    text = page.read_text()
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def shell_lines(language: str, lines: list[str]) -> Iterator[str]:
    """The commands of a shell block: continuations joined, comments cut; in a console block
    only the ``$`` lines (the rest is output)."""
    if language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    joined = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        command = re.sub(r"\s+#.*$", "", joined + line).strip()
        joined = ""
        if command and not command.startswith("#"):
            yield command


def examples(languages=SHELL, pages=PAGES) -> list[tuple[str, str, str]]:
    """(where, language, command) for every command of every shell block of ``pages``."""
    found = []
    for page in pages:
        for language, start, lines in code_blocks(page):
            if language in languages:
                for command in shell_lines(language, lines):
                    found.append((f"{page.relative_to(REPO)}:{start}", language, command))
    return found


def hpctrain_arguments(command: str) -> list[str] | None:
    """The arguments after ``-m hpctrain`` (loop variables given a value), or None."""
    command = re.sub(r"\$\(\((\d+)\*n\)\)", lambda m: str(int(m[1]) * int(LOOP_N)), command)
    command = command.replace("${n}", LOOP_N).replace("$n", LOOP_N)
    words = shlex.split(command)
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "hpctrain":
            return words[i + 2:]
    return None


HPCTRAIN = [(where, args) for where, _, command in examples()
            if (args := hpctrain_arguments(command)) is not None]


def test_the_pages_have_examples_to_check():
    assert len(PAGES) > 15 and len(HPCTRAIN) > 30
    commands = {args[0] if args and args[0] in COMMANDS else "train" for _, args in HPCTRAIN}
    assert commands == set(COMMANDS)  # every command has at least one example


@pytest.mark.parametrize("where,args", HPCTRAIN, ids=[w for w, _ in HPCTRAIN])
def test_every_example_command_line_parses(where, args):
    command = args[0] if args and args[0] in COMMANDS else "train"
    args = args[1:] if args[:1] == [command] else args
    parser = command_module(command).build_parser()
    if "--help" in args:
        with pytest.raises(SystemExit) as done:
            parser.parse_args(args)
        assert done.value.code == 0
        return
    options = parser.parse_args(args)
    net = getattr(options, "net", None)
    if net and "/" not in net and not net.endswith((".net", ".onnx")):
        assert net in shipped_names("nets", ".net"), f"{where}: no shipped net {net!r}"


CONSOLE = [(where, command) for where, language, command in examples(("console",))]


@pytest.mark.parametrize("where,command", CONSOLE, ids=[w for w, _ in CONSOLE])
def test_every_console_example_runs(where, command, tmp_path):
    """As a reader would type it, in an empty directory, with this checkout's Python (and its
    mpiexec) and nothing cached or calibrated."""
    words = shlex.split(command)
    if words[0] == "mpiexec":
        words[0] = mpiexec()
        assert words[0], f"{where}: no mpiexec beside this Python or on PATH (make install)"
    words = [sys.executable if word == "python" else word for word in words]
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "HPCTRAIN_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{where}: {command}\n{result.stdout}\n{result.stderr}"


def named_paths(page: Path) -> set[str]:
    """Words of ``page`` (in backticks or in shell blocks) that look like a path in the repo."""
    words = [w for span in re.findall(r"`([^`\n]+)`", prose(page)) for w in span.split()]
    words += [w for _, _, command in examples(pages=[page]) for w in command.split()]
    return {w.rstrip(".,;:)") for w in words if "/" in w and not w.startswith(("/", "$", "~"))
            and "://" not in w and not PLACEHOLDER.search(w)}


def tracked() -> list[str]:
    """The files git tracks (without git, the top-level entries it does not ignore): outputs of
    earlier runs (runs/, build/) are not part of the checkout."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return listed.stdout.splitlines()
    ignored = {line.strip().rstrip("/") for line in (REPO / ".gitignore").read_text().split()}
    return [str(p.relative_to(REPO)) for p in REPO.iterdir() if p.name not in ignored]


def exists(path: str) -> bool:
    """Whether ``path`` (with ``*`` globs) is in the repo, from the top or from hpctrain/."""
    return any(any(base.glob(path)) if "*" in path else (base / path).exists()
               for base in (REPO, REPO / "hpctrain"))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_path_a_page_names_exists(page):
    """Paths under a folder of the repo (or of the package): outputs a run writes (runs/,
    plots/, a checkpoint directory) are not checked."""
    ours = {p.split("/")[0] for p in tracked()}
    ours |= {p.name for p in (REPO / "hpctrain").iterdir()}
    missing = sorted(p for p in named_paths(page)
                     if p.split("/")[0] in ours and not exists(p.rstrip("/")))
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_module_a_page_names_imports(page):
    names = set(re.findall(r"\bhpctrain(?:\.\w+)+", page.read_text()))
    missing = sorted(n for n in names if not PLACEHOLDER.search(n) and not resolves(n))
    assert not missing, f"{page.name} names what the package lacks: {missing}"


def test_every_make_target_a_page_names_exists():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    named = {(where.split(":")[0], target) for where, _, command in examples()
             for target in re.findall(r"^make ([a-z][\w-]*)", command)}
    named |= {(page.name, target) for page in PAGES
              for span in re.findall(r"`([^`\n]+)`", prose(page))
              for target in re.findall(r"^make ([a-z][\w-]*)", span)}
    assert {target for _, target in named} >= {"run", "test", "docs"}
    missing = sorted((name, t) for name, t in named if t not in targets)
    assert not missing, f"make targets named but not in the Makefile: {missing}"


def slug(heading: str) -> str:
    """The anchor of a heading, as GitHub and MyST make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", prose(page), flags=re.M)}


def test_slug_is_the_anchor_a_heading_gets():
    assert slug("Details that make this exact") == "details-that-make-this-exact"
    assert slug("The 1.5D grid (Pr × Pc)") == "the-15d-grid-pr--pc"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_between_pages_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name} links to what is not there: {broken}"


def test_the_site_builds_with_no_warning(tmp_path):
    """Sphinx, nitpicky, every warning an error: a page or docstring that names a module,
    class, function or section that is gone fails here (the ``docs`` extra installs Sphinx).
    Built from a copy, so that the generated API pages land outside the checkout. The dummy
    builder reads and resolves every page as the HTML one does (the cross-references are
    checked when a page is resolved), without writing HTML; ``make docs`` writes it."""
    source = shutil.copytree(REPO / "docs", tmp_path / "docs",
                             ignore=shutil.ignore_patterns("generated", "_build"))
    result = subprocess.run([sys.executable, "-m", "sphinx", "-b", "dummy", "-j", "auto", "-n",
                             "-W", "--keep-going", "-q", str(source), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (source / "reference" / "generated" / "hpctrain.plan.planner.rst").exists()


def test_the_architecture_page_names_every_folder_in_import_order():
    """Its table lists the package's folders top down, in the order tests/test_imports.py
    enforces: a new folder, or one that moves a floor, must be described there."""
    from tests.test_imports import ORDER

    text = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `hpctrain/(\w+)(?:/|\.py)`", text, flags=re.M)
    folders = {p.name for p in (REPO / "hpctrain").iterdir() if (p / "__init__.py").exists()}
    assert folders - set(rows) == set(), "folders missing from docs/architecture.md"
    assert [row for row in rows if row in ORDER] == [m for m in reversed(ORDER) if m != "__main__"]
