"""tfgpu._internal.helpers.files: run-directory files are appended to or rotated, never truncated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tfgpu._internal.helpers.files import (
    add_session,
    free_name,
    read_json_object,
    rotate,
    write_text_atomic,
)


def test_rotate_moves_aside_to_the_first_free_number(tmp_path):
    path = tmp_path / "timeline.csv"
    assert rotate(path) is None
    for n in (1, 2):
        path.write_text(f"run {n}\n")
        assert rotate(path) == tmp_path / f"timeline.{n}.csv"
    assert not path.exists()
    assert (tmp_path / "timeline.1.csv").read_text() == "run 1\n"
    assert (tmp_path / "timeline.2.csv").read_text() == "run 2\n"
    assert free_name(path) == tmp_path / "timeline.3.csv"


def test_add_session_keeps_every_earlier_session(tmp_path):
    path = tmp_path / "run.json"
    for pid in (1, 2, 3):
        add_session(path, {"pid": pid})
    record = json.loads(path.read_text())
    assert record["pid"] == 3
    assert [s["pid"] for s in record["earlier_sessions"]] == [1, 2]


@pytest.mark.parametrize("damaged", [b"[1, 2]", b"\xff\xfe garbage", b"{not json"])
def test_add_session_rotates_a_damaged_record_instead_of_overwriting_it(tmp_path, damaged):
    path = tmp_path / "run.json"
    path.write_bytes(damaged)
    add_session(path, {"pid": 7})
    assert json.loads(path.read_text()) == {"pid": 7}
    assert (tmp_path / "run.1.json").read_bytes() == damaged


def test_read_json_object_names_the_file(tmp_path):
    path = tmp_path / "diagnosis.json"
    path.write_text("[]")
    with pytest.raises(ValueError, match=r"diagnosis\.json holds a JSON list, not an object"):
        read_json_object(path)
    path.write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match=r"diagnosis\.json is not valid JSON"):
        read_json_object(path)


def test_write_text_atomic_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "a.json"
    write_text_atomic(path, "1")
    write_text_atomic(path, "2")
    assert path.read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_importing_it_loads_no_tensorflow():
    code = "import sys, tfgpu._internal.helpers.files; print([m for m in sys.modules if m.startswith('tensorflow')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_result_s_record_and_plot_are_rotated_and_a_failure_is_a_warning(tmp_path):
    import json

    from tfgpu._internal.helpers.files import write_result

    def draw(path):
        path.write_bytes(b"png")

    for _ in range(2):
        write_result(tmp_path, "tune", {"a": 1}, "tune.json", draw, "tune.png")
    assert json.loads((tmp_path / "tune.json").read_text()) == {"a": 1}
    assert (tmp_path / "tune.1.json").exists() and (tmp_path / "tune.1.png").exists()

    def broken(path):
        raise RuntimeError("no backend")

    with pytest.warns(UserWarning, match=r"^scaling: scaling\.png not written to .*no backend"):
        write_result(tmp_path, "scaling", {"b": 2}, "scaling.json", broken, "scaling.png")
    assert json.loads((tmp_path / "scaling.json").read_text()) == {"b": 2}  # the record stays
    (tmp_path / "file").write_text("")
    with pytest.warns(UserWarning, match=r"^tune: tune\.json not written to .*file"):
        write_result(tmp_path / "file", "tune", {}, "tune.json", draw, "tune.png")
