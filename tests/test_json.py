"""`tfgpu._internal.helpers.jsonable.json_safe`: records become strict JSON."""

import json
import math

import numpy as np

from tfgpu._internal.helpers.jsonable import json_safe


def test_json_safe_gives_strict_json():
    record = {
        "nan": math.nan,
        "inf": -math.inf,
        "np": (np.float32(1.5), np.int64(3), np.float64("nan")),
        1: None,
        "obj": object,
    }
    out = json_safe(record)
    assert out["nan"] is None and out["inf"] is None
    assert out["np"] == [1.5, 3, None] and type(out["np"][1]) is int
    assert out["1"] is None and out["obj"] == str(object)
    json.dumps(out, allow_nan=False)  # raises if anything non-strict is left
