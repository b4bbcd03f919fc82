"""The one result base of the measuring front ends: `to_dict` through one JSON policy, and
one writer for their files, a failure a warning (docs/architecture.md, "The measuring core")."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any, ClassVar

from tfgpu._internal.helpers.files import write_result, write_text_atomic
from tfgpu._internal.helpers.jsonable import json_safe


def plain(value: Any) -> Any:
    """`value` with dataclasses turned into dicts, all the way down."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class Result:
    """A measuring front end's result (a dataclass): `to_dict()` and `write(log_dir)`; its
    files (`json_name`, `png_name` drawn by `plot(path)`: "" for none), the fields left out of
    the record (`unsaved`: a dataset)."""

    json_name: ClassVar[str] = ""
    png_name: ClassVar[str] = ""
    unsaved: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """Returns the result as JSON-ready data (every field but `unsaved` ones)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return json_safe(
            {f.name: plain(getattr(self, f.name)) for f in fields if f.name not in self.unsaved}
        )

    def plot(self, path: Path) -> None:
        """Draws the result's figure into `path` (PNG); only where `png_name` is set."""
        raise NotImplementedError

    def write(self, log_dir: Path) -> None:
        """Writes the record (`to_dict()` with the printed text as `"text"`, which
        `tfgpu report` shows) and the plot into `log_dir`."""
        record = {**self.to_dict(), "text": str(self)}
        who, plot = self.json_name.split(".")[0], self.plot if self.png_name else None
        write_result(log_dir, who, record, self.json_name, plot, self.png_name)


def save_figure(fig: Any, path: Path) -> None:
    """Writes a matplotlib `Figure` to `path` as PNG, atomically."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    write_text_atomic(path, png.getvalue())
