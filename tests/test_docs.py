"""Every code block of README.md, docs/*.md and examples/README.md runs (issue 16).

Blocks tagged python, bash, sh, shell or console run; `text`, `yaml`, ... and untagged ones are
output samples or configuration. A page's runnable blocks run in document order in ONE fresh
Python process (`tests/docs_runner.py`; later blocks see earlier names), in a temporary
directory, with `TFGPU_QUICK=1`, `TF_CPP_MIN_LOG_LEVEL=2`, `MPLBACKEND=Agg`, the venv's `bin/`
first on PATH and `TFGPU_DOCS_REPO` the repository root; shell blocks run from that process
with `bash -e -o pipefail` in the same directory (in `console` blocks only the `$ ` lines).
HTML comments right above a fence steer it:

- `<!-- test: skip REASON -->`: not run; reported as a pytest skip with the reason (needs a
  GPU, several machines, Slurm, a download; runs the whole suite; installs the package).
- `<!-- test: setup` ... `-->`: hidden Python run just before the block, in the same process
  (small stand-ins: data, a tiny model, files for a shell block); `REPO` is defined for it.
- `<!-- test: replace OLD => NEW -->`: a text replacement in the block (`epochs=10 =>
  epochs=1`); OLD must be there.

A failure names the page, the block's line and first line, and the stderr tail. Relative
links between the pages are checked too. docs/from_keras.md has its own test
(tests/test_docs_from_keras.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO

RUNNER = Path(__file__).resolve().parent / "docs_runner.py"
RUNNABLE = {"python", "bash", "sh", "shell", "console"}
TIMEOUT = 420  # one page, seconds


def _pages() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "from_keras.md")
    return [REPO / "README.md", *docs, REPO / "examples" / "README.md"]


PAGES = _pages()

_FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
_SKIP = re.compile(r"^\s*<!-- test: skip (\S.*?)\s*-->\s*$")
_REPLACE = re.compile(r"^\s*<!-- test: replace (.+?) => (.*?)\s*-->\s*$")
_SETUP = re.compile(r"^\s*<!-- test: setup\s*$")


class DirectiveError(ValueError):
    """A `<!-- test: ... -->` directive that is malformed or not followed by a fence."""


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None = None
    setup: list[tuple[int, str]] = field(default_factory=list)
    replace: list[tuple[str, str]] = field(default_factory=list)

    @property
    def first_line(self) -> str:
        lines = [ln.strip() for ln in self.code.splitlines() if ln.strip()]
        return next((ln for ln in lines if not ln.startswith("#!")), "")

    def to_run(self) -> dict:
        code = self.code
        for old, new in self.replace:
            if old not in code:
                raise DirectiveError(
                    f"{self.page}:{self.line}: `replace {old} => {new}`: {old!r} is not in the block"
                )
            code = code.replace(old, new)
        return {
            "page": self.page,
            "line": self.line,
            "lang": self.lang,
            "code": code,
            "setup": self.setup,
        }


def parse(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page with the directives above each."""
    rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    pending: dict = {"skip": None, "setup": [], "replace": [], "line": None}
    i = 0

    def has_pending() -> bool:
        return bool(pending["skip"] or pending["setup"] or pending["replace"])

    while i < len(lines):
        text = lines[i]
        fence = _FENCE.match(text)
        if fence:
            indent, lang = fence.group(1), fence.group(2).lower()
            body: list[str] = []
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                line = lines[j]
                body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
                j += 1
            if j == len(lines):
                raise DirectiveError(f"{rel}:{i + 1}: a code block that is never closed")
            if has_pending() and lang not in RUNNABLE:
                raise DirectiveError(
                    f"{rel}:{pending['line']}: a test directive above a `{lang or 'untagged'}` block, which never runs"
                )
            blocks.append(
                Block(
                    rel,
                    i + 1,
                    lang,
                    "\n".join(body) + "\n",
                    pending["skip"],
                    pending["setup"],
                    pending["replace"],
                )
            )
            pending = {"skip": None, "setup": [], "replace": [], "line": None}
            i = j + 1
            continue
        if "<!-- test:" in text:
            pending["line"] = pending["line"] or i + 1
            if skip := _SKIP.match(text):
                pending["skip"] = skip.group(1)
            elif replace := _REPLACE.match(text):
                pending["replace"].append((replace.group(1), replace.group(2)))
            elif _SETUP.match(text):
                start = i + 1
                j = i + 1
                while j < len(lines) and lines[j].strip() != "-->":
                    j += 1
                if j == len(lines):
                    raise DirectiveError(f"{rel}:{i + 1}: a setup directive without its `-->` line")
                pending["setup"].append((start, "\n".join(lines[start:j]) + "\n"))
                i = j
            else:
                raise DirectiveError(
                    f"{rel}:{i + 1}: unknown test directive {text.strip()!r}; expected "
                    "`<!-- test: skip REASON -->`, `<!-- test: replace OLD => NEW -->` or "
                    "`<!-- test: setup` ... `-->`"
                )
        elif text.strip() and has_pending():
            raise DirectiveError(
                f"{rel}:{pending['line']}: a test directive not followed by a code block "
                f"(line {i + 1} is text)"
            )
        i += 1
    if has_pending():
        raise DirectiveError(f"{rel}:{pending['line']}: a test directive at the end of the page")
    return blocks


def _runnable(path: Path) -> list[Block]:
    return [b for b in parse(path) if b.lang in RUNNABLE]


def _page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


RUN_PAGES = [p for p in PAGES if any(b.skip is None for b in _runnable(p))]
SKIPPED = [b for p in PAGES for b in _runnable(p) if b.skip is not None]


def run_page(blocks: list[Block], workdir: Path, *, timeout: float = TIMEOUT) -> None:
    """Runs `blocks` (one page's, not skipped) in `workdir`; raises AssertionError on failure."""
    spec = workdir / ".docs_blocks.json"
    spec.write_text(json.dumps([b.to_run() for b in blocks]))
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "TFGPU_QUICK": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "KERAS_BACKEND": "tensorflow",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": str(REPO),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "TFGPU_DOCS_REPO": str(REPO),
    }
    try:
        proc = subprocess.run(
            [sys.executable, str(RUNNER), str(spec)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr or b""
        stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        returncode, out, err = None, "", stderr
    else:
        returncode, out, err = proc.returncode, proc.stdout, proc.stderr
    if returncode == 0:
        return
    started = re.findall(r"^@@docs-block (\d+)$", err, re.M)
    block = blocks[int(started[-1])] if started else None
    where = (
        f"{block.page}, the {block.lang} block at line {block.line} starting {block.first_line!r}"
        if block
        else "before the first block"
    )
    status = "timed out" if returncode is None else f"exit status {returncode}"
    tail = re.sub(r"^@@docs-(block|failed) \d+\n", "", err, flags=re.M)[-3000:]
    raise AssertionError(
        f"docs block failed ({status}): {where}\n--- stderr (tail) ---\n{tail}"
        f"\n--- stdout (tail) ---\n{out[-1500:]}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=_page_id)
def test_page_runs(page, tmp_path):
    run_page([b for b in _runnable(page) if b.skip is None], tmp_path)


@pytest.mark.parametrize(
    "block", SKIPPED, ids=[f"{b.page}:{b.line}" for b in SKIPPED] if SKIPPED else None
)
def test_skipped_block(block):
    pytest.skip(f"{block.page}:{block.line} `{block.first_line}`: {block.skip}")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_directives_are_well_formed(page):
    for block in _runnable(page):
        block.to_run()  # a `replace` whose OLD is gone raises


def test_directives_are_checked(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- test: skip -->\n```python\npass\n```\n")
    with pytest.raises(DirectiveError, match="unknown test directive"):
        parse(page)
    page.write_text("<!-- test: skip needs a GPU -->\nSome text.\n```python\npass\n```\n")
    with pytest.raises(DirectiveError, match="not followed by a code block"):
        parse(page)
    page.write_text("<!-- test: replace x => y -->\n```text\nx\n```\n")
    with pytest.raises(DirectiveError, match="never runs"):
        parse(page)
    page.write_text("<!-- test: replace epochs=9 => epochs=1 -->\n```python\nepochs=5\n```\n")
    with pytest.raises(DirectiveError, match="'epochs=9' is not in the block"):
        parse(page)[0].to_run()


def test_a_page_runs_in_order_with_setup_replace_and_shell(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- test: setup\nseen = ['setup']\n-->\n```python\nseen.append('a')\n```\n\n"
        "Text between.\n\n<!-- test: replace 'b' => 'c' -->\n```python\nseen.append('b')\n"
        "open('seen.txt', 'w').write(','.join(seen))\n```\n"
        '```console\n$ test "$(cat seen.txt)" = setup,a,c\nsome output\n```\n'
        '```bash\ntest "$TFGPU_QUICK" = 1 && command -v tfgpu\n```\n'
        "```text\nthis never runs\n```\n"
    )
    blocks = parse(page)
    assert [b.lang for b in blocks] == ["python", "python", "console", "bash", "text"]
    run_page([b for b in blocks if b.lang in RUNNABLE], tmp_path, timeout=60)


def test_a_failure_names_the_page_the_block_and_the_stderr(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n```python\nvalue = {}\nvalue['missing']\n```\n"
        "```bash\necho never\n```\n"
    )
    with pytest.raises(AssertionError) as info:
        run_page(parse(page), tmp_path, timeout=60)
    message = str(info.value)
    assert "page.md, the python block at line 5 starting 'value = {}'" in message
    assert "KeyError: 'missing'" in message
    assert 'File "page.md", line 7' in message  # the page's own line numbers
    page.write_text("```bash\necho to stderr >&2\nfalse\n```\n")
    with pytest.raises(AssertionError, match=r"(?s)bash block at line 1 .*to stderr"):
        run_page(parse(page), tmp_path, timeout=60)


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize(
    "page", [*PAGES, REPO / "docs" / "from_keras.md"], ids=lambda p: _page_id(p)
)
def test_links_between_pages_resolve(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{_page_id(page)}: " + "; ".join(broken)


def test_every_docs_page_links_to_another():
    for page in (REPO / "docs").glob("*.md"):
        links = re.findall(r"\]\(([\w./-]+\.md)[#)]", page.read_text())
        assert links, f"{_page_id(page)} links to no other page"
