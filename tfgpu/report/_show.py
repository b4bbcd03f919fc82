"""`ReportPath`: the path of `report.md` that shows itself (in a notebook rendered with its
plots, also as a cell's value; elsewhere printed); only `show` has effects."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path, PosixPath, WindowsPath

from tfgpu._internal.helpers.progress import in_ipython_kernel

# report.md names each plot on a line of its own: `![utilization](utilization.png)`.
_IMAGE_LINE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+\.png)\)\s*$")


def _parts(text: str, folder: Path) -> list[tuple[str, str]]:
    """`report.md`'s text cut at its image lines: `("markdown", text)` and `("image", path)`.
    An image line whose file is missing stays in the text (a link that says what is gone)."""
    parts: list[tuple[str, str]] = []
    lines: list[str] = []
    for line in text.splitlines():
        m = _IMAGE_LINE.match(line)
        if m and (folder / m.group(2)).is_file():
            parts += [("markdown", "\n".join(lines)), ("image", str(folder / m.group(2)))]
            lines = []
        else:
            lines.append(line)
    parts.append(("markdown", "\n".join(lines)))
    # No blank Markdown between two plots or at either end.
    return [(kind, value.strip("\n")) for kind, value in parts if value.strip()]


def _inlined(text: str, folder: Path) -> str:
    """`report.md`'s text with each plot as a `data:` URI: Markdown that needs no files."""
    out = []
    for kind, value in _parts(text, folder):
        if kind == "image":
            data = base64.b64encode(Path(value).read_bytes()).decode("ascii")
            out.append(f"![{Path(value).stem}](data:image/png;base64,{data})")
        else:
            out.append(value)
    return "\n\n".join(out) + "\n"


def _notebook_display():
    """IPython's `display` when this runs in a kernel that shows rich output, else None."""
    if not in_ipython_kernel():  # plain Python or a terminal IPython
        return None
    try:
        from IPython import display

        return display
    except ImportError:  # an IPython without `display`: fall back to plain text
        return None


if sys.platform == "win32":  # pathlib's concrete class for this system (3.10, 3.11)
    _ConcretePath = WindowsPath
else:
    _ConcretePath = PosixPath


class ReportPath(_ConcretePath):
    """The path of `report.md`, as `write_report` returns it, with a way to look at it.

    A `pathlib.Path` in every other respect (`read_text()`, `parent`, `str()`). The guide:
    docs/metrics.md, section "Reading the files".

    Example:

    >>> report = tfgpu.report.write_report("runs/exp1")  # doctest: +SKIP
    >>> report.show()  # in a notebook: the summary rendered, then the plots  # doctest: +SKIP
    """

    def with_segments(self, *pathsegments):  # Python >= 3.12: derived paths are plain
        return Path(*pathsegments)

    def show(self) -> None:
        """Shows the report: rendered with its plots in a notebook, as text elsewhere.

        In an IPython kernel (Jupyter, VS Code, Colab) the summary is rendered and each plot
        shown in order; elsewhere the text is printed, each plot as the path of its file.

        Raises:
            OSError: if `report.md` is gone (`FileNotFoundError`) or cannot be read.

        Example:

        >>> from tfgpu.report import write_report
        >>> write_report("runs/exp1").show()  # doctest: +SKIP
        """
        text = self.read_text()
        display = _notebook_display()
        for kind, value in _parts(text, self.parent):
            if display is None:  # a terminal: each plot as the path of its file
                print(f"[plot: {value}]" if kind == "image" else value)
            elif kind == "image":
                display.display(display.Image(filename=value))
            else:
                display.display(display.Markdown(value))

    def _repr_markdown_(self) -> str | None:
        """The report rendered where a notebook shows a cell's value (plots inlined)."""
        if self.suffix != ".md":  # a path derived from this one (Python < 3.12)
            return None
        try:
            return _inlined(self.read_text(), self.parent)
        except (OSError, UnicodeDecodeError):  # gone or unreadable: the plain repr
            return None
