"""Runs the code blocks of one docs page, in order, in this process (used by tests/test_docs.py).

Usage: `python docs_runner.py BLOCKS.json`, in the working directory the blocks should see.
BLOCKS.json is a list of blocks, each `{"page", "line", "lang", "code", "setup"}` (`setup`: a
list of `[line, code]` of hidden Python run just before the block). Python blocks run with
`exec` in one namespace (later blocks see earlier names); shell blocks run with
`bash -e -o pipefail` in the same working directory. Before each block a marker line
`@@docs-block K` goes to stderr; a failing block prints `@@docs-failed K` after its error and
the process exits 1. Imports nothing heavy itself: a page without Python pays no TensorFlow.
"""

from __future__ import annotations

import json
import linecache
import os
import subprocess
import sys
import traceback
from pathlib import Path


def _compiled(code: str, page: str, line: int):
    # Leading newlines make a traceback's line numbers those of the page itself.
    return compile("\n" * line + code, page, "exec")


def _register_sources(blocks: list[dict]) -> None:
    """Puts the code that runs into `linecache`, at the page's own line numbers.

    `inspect.getsource` (tracebacks, and AutoGraph, which re-reads a function's source when
    tf.data traces it) then finds the blocks' code instead of this file's lines.
    """
    pages: dict[str, dict[int, str]] = {}
    for block in blocks:
        lines = pages.setdefault(block["page"], {})
        for line, code in [*block["setup"], (block["line"], block["code"])]:
            for k, text in enumerate(code.splitlines(), start=line + 1):
                lines[k] = text
    for page, lines in pages.items():
        text = [lines.get(k, "") + "\n" for k in range(1, max(lines, default=0) + 1)]
        linecache.cache[page] = (sum(map(len, text)), None, text, page)


def _shell(code: str, lang: str) -> int:
    if lang == "console":
        commands = [ln[2:] for ln in code.splitlines() if ln.startswith("$ ")]
        code = "\n".join(commands) + "\n"
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code]).returncode


def main(path: str) -> int:
    blocks = json.loads(Path(path).read_text())
    _register_sources(blocks)
    namespace: dict = {"__name__": "__main__", "REPO": Path(os.environ["TFGPU_DOCS_REPO"])}
    for k, block in enumerate(blocks):
        print(f"@@docs-block {k}", file=sys.stderr, flush=True)
        try:
            for line, code in block["setup"]:
                exec(_compiled(code, block["page"] + " (setup)", line), namespace)
            if block["lang"] == "python":
                exec(_compiled(block["code"], block["page"], block["line"]), namespace)
            else:
                status = _shell(block["code"], block["lang"])
                if status != 0:
                    print(f"shell block exited with status {status}", file=sys.stderr)
                    print(f"@@docs-failed {k}", file=sys.stderr, flush=True)
                    return 1
        except BaseException:
            traceback.print_exc()
            print(f"@@docs-failed {k}", file=sys.stderr, flush=True)
            return 1
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
