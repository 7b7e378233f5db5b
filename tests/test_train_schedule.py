"""Tests for rove.train.schedule (warm-up + cosine, WSD).

Run: /tmp/venv/bin/pytest tests/test_train_schedule.py -q
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rove.train import config
from rove.train.schedule import LR_SCHEDULES, cosine_schedule, lr_multiplier, wsd_schedule


def test_cosine_known_values():
    assert cosine_schedule(0, 100, 10) == pytest.approx(0.1)
    assert cosine_schedule(9, 100, 10) == pytest.approx(1.0)
    assert cosine_schedule(10, 100, 10) == pytest.approx(1.0)
    assert cosine_schedule(55, 100, 10, 0.1) == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert cosine_schedule(100, 100, 10, 0.1) == pytest.approx(0.1)
    assert cosine_schedule(500, 100, 10, 0.1) == pytest.approx(0.1)  # clamped past the end


def test_paper_recipe_schedule():
    """124M: 700 warm-up steps, cosine to 10 % over 19,073 steps."""
    f = [cosine_schedule(s, 19_073, 700, 0.1) for s in (0, 699, 700, 19_072)]
    assert f[0] == pytest.approx(1 / 700)
    assert f[1] == f[2] == pytest.approx(1.0)
    assert f[3] == pytest.approx(0.1, abs=1e-6)


def test_wsd_known_values():
    # 100 steps, 10 warm-up, decay over the last 20 (steps 80..100)
    assert wsd_schedule(5, 100, 10) == pytest.approx(0.6)
    assert wsd_schedule(50, 100, 10) == 1.0
    assert wsd_schedule(79, 100, 10) == 1.0
    assert wsd_schedule(90, 100, 10, 0.1, 0.2, "linear") == pytest.approx(0.55)
    assert wsd_schedule(90, 100, 10, 0.1, 0.2, "cosine") == pytest.approx(0.55)
    assert wsd_schedule(85, 100, 10, 0.0, 0.2, "cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi / 4))
    )
    assert wsd_schedule(100, 100, 10, 0.1, 0.2) == pytest.approx(0.1)


def test_no_warmup_and_dispatch():
    assert cosine_schedule(0, 10, 0) == 1.0
    assert lr_multiplier(3, schedule="wsd", max_steps=10, warmup_steps=0, min_ratio=0.1) == 1.0
    with pytest.raises(ValueError, match=r"schedule 'linear'; choose one of \('cosine', 'wsd'\)"):
        lr_multiplier(0, schedule="linear", max_steps=10, warmup_steps=0, min_ratio=0.1)
    # one list of LR schedules: the config's choices are the ones lr_multiplier dispatches on
    assert config.LR_SCHEDULES is LR_SCHEDULES
    for name in LR_SCHEDULES:
        assert lr_multiplier(0, schedule=name, max_steps=9, warmup_steps=0, min_ratio=0.1) == 1.0
    with pytest.raises(ValueError, match="step"):
        cosine_schedule(-1, 10, 2)
    with pytest.raises(ValueError, match="decay shape"):
        wsd_schedule(9, 10, 0, decay_shape="exp")


@given(
    max_steps=st.integers(1, 5000),
    warmup=st.integers(0, 500),
    min_ratio=st.floats(0.0, 1.0),
    schedule=st.sampled_from(["cosine", "wsd"]),
    shape=st.sampled_from(["linear", "cosine"]),
    frac=st.floats(0.0, 1.0),
)
def test_schedule_properties(max_steps, warmup, min_ratio, schedule, shape, frac):
    warmup = min(warmup, max_steps)

    def f(s):
        return lr_multiplier(
            s,
            schedule=schedule,
            max_steps=max_steps,
            warmup_steps=warmup,
            min_ratio=min_ratio,
            decay_fraction=frac,
            decay_shape=shape,
        )

    steps = sorted({0, warmup, max_steps // 2, max_steps - 1, max_steps, max_steps + 7})
    values = [f(s) for s in steps]
    for s, v in zip(steps, values, strict=True):
        if s >= warmup:
            assert min_ratio - 1e-12 <= v <= 1.0 + 1e-12
        else:
            assert 0 < v <= 1.0
    after = [v for s, v in zip(steps, values, strict=True) if s >= warmup]
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(after))  # non-increasing
    no_decay = warmup >= max_steps or (schedule == "wsd" and round(frac * max_steps) == 0)
    assert f(max_steps) == pytest.approx(min_ratio) or no_decay
