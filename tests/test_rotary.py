"""Frequency schedules, tables and the rotation itself.

Run: pytest tests/test_rotary.py
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rove.model import GPT, PRESETS, GPTConfig
from rove.reference import rotation_matrix
from rove.rotary import (
    SCALING_KINDS,
    SCALING_PARAMS,
    SCHEDULES,
    LinearParams,
    NTKParams,
    Rotary,
    Scaling,
    YarnParams,
    apply_rotary,
    convention_permutation,
    convert_convention,
    rotary_frequencies,
    rotation_tables,
)


def np_base(dim: int, base: float) -> np.ndarray:
    return np.array([base ** (-(2 * m) / dim) for m in range(dim // 2)])


YARN4 = {"type": "yarn", "factor": 4.0, "original_max_position": 64}


class TestSchedules:
    def test_default(self):
        f = rotary_frequencies(64, 10000.0)
        np.testing.assert_allclose(f.inv_freq.numpy(), np_base(64, 10000.0), rtol=1e-15)
        assert f.inv_freq.dtype == torch.float64 and f.attention_factor == 1.0

    def test_partial_uses_rotary_dim_as_denominator(self):
        # HF partial rotary: the exponent is 2m / rotary_dim, not 2m / head_dim
        r = Rotary(64, fraction=0.25)
        assert r.rotary_dim == 16
        np.testing.assert_allclose(r.frequencies().inv_freq.numpy(), np_base(16, 10000.0))

    def test_linear(self):
        f = rotary_frequencies(32, 500.0, Scaling("linear", {"factor": 4.0}))
        np.testing.assert_allclose(f.inv_freq.numpy(), np_base(32, 500.0) / 4)

    def test_ntk(self):
        f = rotary_frequencies(32, 10000.0, Scaling("ntk", {"factor": 8}))
        new_base = 10000.0 * 8 ** (32 / 30)
        np.testing.assert_allclose(f.inv_freq.numpy(), np_base(32, new_base), rtol=1e-12)
        assert f.inv_freq[0] == 1.0  # the fastest plane is never stretched

    def test_dynamic_ntk(self):
        scaling = Scaling("dynamic-ntk", {"factor": 2.0, "original_max_position": 128})
        short = rotary_frequencies(32, 10000.0, scaling, seq_len=100)
        np.testing.assert_allclose(short.inv_freq.numpy(), np_base(32, 10000.0))
        long = rotary_frequencies(32, 10000.0, scaling, seq_len=512)
        new_base = 10000.0 * (2.0 * 512 / 128 - 1) ** (32 / 30)
        np.testing.assert_allclose(long.inv_freq.numpy(), np_base(32, new_base), rtol=1e-12)

    def test_yarn_matches_hand_computed_ramp(self):
        # dim 64, base 1e4, factor 4, original 1024: correction dims
        #   low  = floor(64 ln(1024 / (32 * 2 pi)) / (2 ln 1e4)) = floor(5.655) = 5
        #   high = ceil (64 ln(1024 / ( 1 * 2 pi)) / (2 ln 1e4)) = ceil(17.697) = 18
        # ramp over the dimension index m: (m - 5) / 13 clamped to [0, 1]
        f = rotary_frequencies(
            64, 10000.0, Scaling("yarn", {"factor": 4.0, "original_max_position": 1024})
        )
        base = np_base(64, 10000.0)
        expected = []
        for m in range(32):
            interp = min(max((m - 5) / 13, 0.0), 1.0)
            expected.append(base[m] * (1 - interp) + base[m] / 4 * interp)
        np.testing.assert_allclose(f.inv_freq.numpy(), expected, rtol=1e-14)
        assert f.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
        assert f.logit_scale == pytest.approx((0.1 * math.log(4) + 1) ** 2)

    def test_yarn_mscale_ratio(self):
        f = rotary_frequencies(
            64,
            10000.0,
            Scaling(
                "yarn",
                {
                    "factor": 40.0,
                    "original_max_position": 4096,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                },
            ),
        )
        assert f.attention_factor == pytest.approx(1.0)

    def test_yarn_factor_one_is_plain(self):
        f = rotary_frequencies(
            64, 10000.0, Scaling("yarn", {"factor": 1.0, "original_max_position": 64})
        )
        np.testing.assert_allclose(f.inv_freq.numpy(), np_base(64, 10000.0))
        assert f.attention_factor == 1.0

    @pytest.mark.parametrize(
        "scaling, error, match",
        [
            ({"type": "yarnn", "factor": 2}, ValueError, "unknown rotary scaling type"),
            ({"type": "yarn", "factor": 2}, ValueError, "original_max_position"),
            ({"type": "linear", "factor": 2, "beta": 1}, ValueError, "unknown parameter"),
            ({"type": "linear", "factor": "2"}, TypeError, "must be a number"),
            ({"type": "linear", "factor": 0.5}, ValueError, "factor must be >= 1"),
            ({"type": "yarn", "factor": 2, "original_max_position": 0}, ValueError, "> 0"),
            ({"type": "dynamic-ntk", "factor": 2, "original_max_position": -8}, ValueError, "> 0"),
            ({**YARN4, "beta_fast": 0.0}, ValueError, "'beta_fast' must be > 0"),
            ({**YARN4, "mscale": 0, "mscale_all_dim": 1.0}, ValueError, "HF treats 0 as absent"),
            ({**YARN4, "mscale": 1.0, "mscale_all_dim": 0.0}, ValueError, "HF treats 0 as absent"),
            ({**YARN4, "attention_factor": -1.0}, ValueError, "must be > 0"),
        ],
    )
    def test_bad_scaling(self, scaling, error, match):
        with pytest.raises(error, match=match):
            Rotary(64, scaling=scaling)

    @settings(max_examples=40, deadline=None)
    @given(
        scaling=st.sampled_from(
            [
                {"type": "linear", "factor": 2.0},
                {"type": "ntk", "factor": 2.0},
                {"type": "dynamic-ntk", "factor": 2.0, "original_max_position": 64},
                {**YARN4, "mscale": 1.0, "mscale_all_dim": 1.0, "attention_factor": 1.1},
            ]
        ),
        bad=st.sampled_from([math.nan, math.inf, -math.inf]),
        data=st.data(),
    )
    def test_non_finite_parameters_are_refused(self, scaling, bad, data):
        """Any NaN / inf parameter or base fails at construction, never as NaN outputs."""
        name = data.draw(st.sampled_from([*sorted(set(scaling) - {"type"}), "base"]))
        with pytest.raises(ValueError, match="finite"):
            if name == "base":
                Rotary(64, base=bad, scaling=scaling)
            else:
                Rotary(64, scaling={**scaling, name: bad})

    @pytest.mark.parametrize("kind", ["ntk", "dynamic-ntk"])
    def test_ntk_needs_four_rotated_channels(self, kind):
        scaling = {"type": kind, "factor": 2.0}
        if kind == "dynamic-ntk":
            scaling["original_max_position"] = 8
        with pytest.raises(ValueError, match="rotary_dim >= 4"):
            Rotary(8, 2, scaling=scaling)
        assert Rotary(8, 4, scaling=scaling).rotary_dim == 4

    def test_dynamic_ntk_length_is_max_position_plus_one(self):
        """One rule for every path: tables, rotate and an explicit pin agree at positions 4096..."""
        r = Rotary(16, scaling={"type": "dynamic-ntk", "factor": 4.0, "original_max_position": 64})
        pos = 4096 + torch.arange(8)
        assert r.dynamic_length(pos) == 4104 and r.dynamic_length(pos[:3], pos) == 4104
        x = torch.randn(1, 2, 8, 16, dtype=torch.float64)
        pinned = r.at_length(4104)
        assert not pinned.dynamic and pinned.dynamic_length(pos) is None
        torch.testing.assert_close(r.rotate(x, pos), pinned.rotate(x, pos), rtol=0, atol=0)
        torch.testing.assert_close(r.rotate(x, offset=4096), r.rotate(x, pos), rtol=0, atol=0)
        cos, _ = r.tables(pos, torch.float64)
        torch.testing.assert_close(cos, pinned.tables(pos, torch.float64)[0], rtol=0, atol=0)
        assert Rotary(16).at_length(5) is not None and not Rotary(16).at_length(5).dynamic


class TestScaling:
    """The typed spec: checked when made, ``None`` for no scaling, a dict form for JSON."""

    def test_validated_when_made(self):
        with pytest.raises(ValueError, match="unknown rotary scaling type 'yarnn'; choose one of"):
            Scaling("yarnn", {"factor": 2.0})
        with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['beta'\] for rotary"):
            Scaling("linear", {"factor": 2.0, "beta": 1})
        with pytest.raises(ValueError, match="needs parameter"):
            Scaling("yarn", {"factor": 2.0})
        with pytest.raises(ValueError, match="'default' is no scaling: use None"):
            Scaling("default")

    def test_dict_form_round_trip(self):
        yarn = Scaling.from_dict(YARN4)
        assert yarn == Scaling("yarn", {"original_max_position": 64, "factor": 4.0})
        assert yarn is not None and yarn.to_dict() == YARN4
        assert Scaling.from_dict(json.loads(json.dumps(yarn.to_dict()))) == yarn
        assert hash(yarn) == hash(Scaling("yarn", {"factor": 4.0, "original_max_position": 64}))

    def test_default_is_none_and_hf_rope_type_is_read(self):
        assert Scaling.from_dict({"type": "default"}) is None
        assert Scaling.from_dict({"rope_type": "default"}) is None
        linear = Scaling("linear", {"factor": 2.0})
        assert Scaling.from_dict({"rope_type": "linear", "factor": 2.0}) == linear
        assert Scaling.from_dict({"type": "linear", "rope_type": "linear", "factor": 2.0}) == linear
        with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['factor'\]"):
            Scaling.from_dict({"type": "default", "factor": 2.0})
        with pytest.raises(ValueError, match="names two kinds"):
            Scaling.from_dict({"type": "linear", "rope_type": "yarn", "factor": 2.0})
        with pytest.raises(ValueError, match="unknown rotary scaling type None"):
            Scaling.from_dict({"factor": 2.0})

    def test_params_are_typed_and_frozen(self):
        params: dict[str, object] = {"factor": 2.0}
        linear = Scaling("linear", params)
        params["factor"] = 0.5
        assert linear.params == LinearParams(factor=2.0) and linear.params.factor == 2.0
        with pytest.raises(dataclasses.FrozenInstanceError):
            linear.params.factor = 0.5  # type: ignore[misc]
        yarn = Scaling("yarn", YarnParams(factor=4.0, original_max_position=64))
        assert yarn == Scaling.from_dict(YARN4) and yarn.params.beta_fast == 32.0
        with pytest.raises(ValueError, match="'linear' takes LinearParams, got NTKParams"):
            Scaling("linear", NTKParams(factor=2.0))
        with pytest.raises(ValueError, match=r"'beta_fast' must be > 0"):
            YarnParams(factor=2.0, original_max_position=8, beta_fast=-1.0)

    def test_bad_key_names_the_valid_ones(self):
        with pytest.raises(ValueError, match=r"\['original_max'\] .* accepts \['factor', 'orig"):
            Scaling("dynamic-ntk", {"factor": 2.0, "original_max": 8})

    def test_stored_dicts_read_back_as_before(self):
        """Configs stored by earlier versions (a checkpoint's GPTConfig.rope_scaling, JSON) load
        unchanged: integral floats and explicit defaults included; the dict form lists what
        differs from the defaults."""
        stored = json.loads(
            '{"type": "yarn", "factor": 4, "original_max_position": 64.0, "beta_fast": 32.0,'
            ' "mscale": null, "truncate": true}'
        )
        yarn = Scaling.from_dict(stored)
        assert yarn == Scaling.from_dict(YARN4)
        assert yarn is not None and yarn.params.original_max_position == 64
        assert isinstance(yarn.params.original_max_position, int)
        assert yarn.to_dict() == {"type": "yarn", "factor": 4, "original_max_position": 64}
        for kind, params in [
            ("linear", {"factor": 2.0}),
            ("ntk", {"factor": 8}),
            ("dynamic-ntk", {"factor": 2.0, "original_max_position": 32}),
            ("yarn", {"factor": 2.0, "original_max_position": 16, "beta_slow": 2.0}),
        ]:
            config = GPTConfig.from_dict(
                {**PRESETS["nano"], "pos": "rope", "rope_scaling": {"type": kind, **params}}
            )
            rotary = GPT(config).rotary
            assert rotary is not None and rotary.scaling is not None
            assert rotary.scaling.to_dict() == {"type": kind, **params}
        with pytest.raises(ValueError, match="must be a whole number"):
            Scaling("yarn", {"factor": 2.0, "original_max_position": 64.5})

    def test_rotary_from_a_scaling_equals_rotary_from_its_dict(self):
        spec = Scaling("yarn", {"factor": 4.0, "original_max_position": 64})
        typed, from_dict = Rotary(64, scaling=spec), Rotary(64, scaling=YARN4)
        assert typed.scaling == from_dict.scaling == spec and repr(typed) == repr(from_dict)
        assert "scaling=Scaling(kind='yarn', params={'factor': 4.0, " in repr(typed)
        pos = torch.arange(100)
        torch.testing.assert_close(typed.tables(pos), from_dict.tables(pos), rtol=0, atol=0)
        assert typed.logit_scale == from_dict.logit_scale > 1
        assert typed.to_dict()["scaling"] == YARN4  # JSON-ready, as before
        assert Rotary(64, scaling={"type": "default"}).scaling is None
        assert typed.with_scaling(None).scaling is None
        assert Rotary(64).with_scaling(YARN4).scaling == spec

    def test_frequencies_take_a_scaling_and_rotary_refuses_other_types(self):
        with pytest.raises(TypeError, match=r"Scaling\.from_dict"):
            rotary_frequencies(64, 10000.0, YARN4)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="a Scaling, a mapping or None, got 'yarn'"):
            Rotary(64, scaling="yarn")  # type: ignore[arg-type]

    def test_kinds_are_the_schedules_but_the_unscaled_one(self):
        from rove.model import SCALING_KINDS as model_kinds

        assert ("default", *SCALING_KINDS) == SCHEDULES
        assert tuple(SCALING_PARAMS) == SCALING_KINDS
        assert all(params.kind == kind for kind, params in SCALING_PARAMS.items())
        assert model_kinds is SCALING_KINDS

    def test_kinds_are_read_only(self):
        """A kind added at run time would bypass SCALING_KINDS, which is fixed at import."""
        with pytest.raises(TypeError):
            SCALING_PARAMS["mine"] = LinearParams  # type: ignore[index]


class TestRotaryValidation:
    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"head_dim": 64, "rotary_dim": 66}, "larger than head_dim"),
            ({"head_dim": 64, "rotary_dim": 7}, "positive even"),
            ({"head_dim": 64, "convention": "neox"}, "unknown rotary convention"),
            ({"head_dim": 64, "rotary_dim": 8, "fraction": 0.5}, "not both"),
            ({"head_dim": 64, "fraction": 1.5}, "fraction"),
        ],
    )
    def test_errors(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            Rotary(**kwargs)

    def test_positions_shape(self):
        r = Rotary(8)
        x = torch.randn(1, 2, 5, 8)
        with pytest.raises(ValueError, match="positions must have shape"):
            r.rotate(x, torch.arange(4))
        with pytest.raises(TypeError, match="integer"):
            r.rotate(x, torch.arange(5.0))
        with pytest.raises(TypeError, match="integer"):
            r.rotate(x, torch.ones(5, dtype=torch.bool))
        with pytest.raises(TypeError, match="floating-point"):
            r.rotate(torch.ones(1, 2, 5, 8, dtype=torch.long))
        with pytest.raises(ValueError, match=r"\(T, D\), \(H, T, D\) or \(B, H, T, D\)"):
            r.rotate(torch.randn(8))
        with pytest.raises(ValueError, match="unknown temperature"):
            Rotary(8, temperature="hf")

    def test_one_broadcasting_rule(self):
        """Positions (T,) or (1 or B, T) for a (B, H, T, D) input; anything else is an error."""
        r = Rotary(8)
        x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
        pos = torch.arange(5) + 7
        torch.testing.assert_close(r.rotate(x, pos[None]), r.rotate(x, pos), rtol=0, atol=0)
        torch.testing.assert_close(r.rotate(x, pos.expand(2, 5)), r.rotate(x, pos), rtol=0, atol=0)
        with pytest.raises(ValueError, match="do not match batch size 2"):
            r.rotate(x, pos.expand(3, 5))
        with pytest.raises(ValueError, match="need x of shape"):
            r.rotate(x[0], pos.expand(2, 5))  # (H, T, D): would rotate per head


@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [4, 8])
def test_rotation_equals_explicit_matrix(convention, rotary_dim):
    r = Rotary(8, rotary_dim, convention=convention, base=50.0)
    pos = torch.tensor([0, 3, -2, 1000])
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    mats = rotation_matrix(r, pos)  # (4, 8, 8)
    expected = torch.einsum("tde,hte->htd", mats, x)
    torch.testing.assert_close(r.rotate(x, pos), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        r.unrotate(x, pos), torch.einsum("ted,hte->htd", mats, x), rtol=0, atol=1e-12
    )


def test_rotations_compose_and_preserve_norm():
    r = Rotary(16, base=100.0)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    a, b = torch.arange(5) * 7, torch.arange(5) * -3
    torch.testing.assert_close(r.rotate(r.rotate(x, a), b), r.rotate(x, a + b), rtol=0, atol=1e-12)
    torch.testing.assert_close(r.rotate(x, a).norm(dim=-1), x.norm(dim=-1), rtol=1e-14, atol=0)


@settings(max_examples=25, deadline=None)
@given(
    pos=st.integers(min_value=0, max_value=1_000_000),
    convention=st.sampled_from(["half", "interleaved"]),
)
def test_exact_inverse_at_long_positions_float32(pos, convention):
    r = Rotary(64, convention=convention)
    x = torch.randn(2, 3, 64, dtype=torch.float32)
    p = torch.full((3,), pos) + torch.arange(3)
    back = r.unrotate(r.rotate(x, p), p)
    rel = (back - x).norm() / x.norm()
    assert rel <= 1e-5


def test_tables_precise_at_long_positions():
    inv = rotary_frequencies(64).inv_freq
    pos = torch.tensor([1_000_000, 16_383])
    cos, sin = rotation_tables(pos, inv, torch.float32)
    exact = [[math.cos(p * float(w)) for w in inv] for p in (1_000_000, 16_383)]
    np.testing.assert_allclose(cos.numpy(), np.array(exact), atol=2e-7)
    # a float32 product p * w would be off by up to ~0.03 rad at p = 1e6
    assert (sin**2 + cos**2 - 1).abs().max() < 1e-6


@pytest.mark.parametrize("src, dst", [("half", "interleaved"), ("interleaved", "half")])
def test_convert_convention(src, dst):
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    pos = torch.arange(6) * 5
    rs, rd = Rotary(12, 8, convention=src), Rotary(12, 8, convention=dst)
    # converting then rotating in dst equals rotating in src then converting
    lhs = rd.rotate(convert_convention(x, 8, src, dst), pos)
    rhs = convert_convention(rs.rotate(x, pos), 8, src, dst)
    torch.testing.assert_close(lhs, rhs, rtol=0, atol=1e-13)
    back = convert_convention(convert_convention(x, 8, src, dst), 8, dst, src)
    torch.testing.assert_close(back, x, rtol=0, atol=0)
    assert sorted(convention_permutation(8, src, dst).tolist()) == list(range(8))


def test_apply_rotary_rejects_wide_tables():
    cos, sin = rotation_tables(torch.arange(3), rotary_frequencies(16).inv_freq)
    with pytest.raises(ValueError, match="cover 16 channels"):
        apply_rotary(torch.randn(3, 8), cos, sin)


def test_softmax_scale_carries_the_temperature_only_where_it_applies_to_every_logit():
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position": 64}
    logits = Rotary(64, scaling=yarn)
    rotated = Rotary(64, rotary_dim=32, scaling=yarn, temperature="rotated")
    assert logits.logit_scale > 1
    assert logits.softmax_scale(64) == pytest.approx(logits.logit_scale / 8)
    assert rotated.softmax_scale(64) == pytest.approx(1 / 8)  # q's rotated channels carry it
    assert Rotary(64).softmax_scale(64) == pytest.approx(1 / 8)
