"""The GEMM search's pure parts (models/bench/gemv.py): which shapes the pre-norm fold is searched at, which of its
configurations are tried, and that a bad ``--parts`` is refused in one line. The timings themselves need a GPU."""

from __future__ import annotations

import pytest
import triton

from models.bench import gemv as bench
from models.engine import build_adapter


def test_the_fold_is_searched_at_each_pre_normed_gemm_and_never_the_lm_head():
    """The tiny model's GDN in_proj, attention qkv and MLP gate|up, as its layers hold them: each distinct shape once;
    not the lm_head, the out projections or the down projection."""
    model = build_adapter("qwen3_5-tiny", seed=0, device="cpu").model
    want = set()
    for layer in model.model.layers:
        want.add(tuple((layer.linear_attn.in_weight() if layer.is_linear else layer.self_attn.qkv_weight()).shape))
        want.add(tuple(layer.mlp.gate_up_weight().shape))
    got = bench._normed_shapes(model)
    assert len(got) == len(set(got)) and set(got) == want
    others = {tuple(model.lm_head.weight.shape), tuple(model.model.layers[0].mlp.down_proj.weight.shape)}
    assert not others & set(got)
    assert set(got) < set(bench._shapes(model))  # every searched shape is a GEMM of the step


@pytest.mark.parametrize("k", [1024, 2048, 3000])
def test_fold_configurations_fit_a_row_tile_and_stage_only_a_walk(k):
    configs = bench._norm_configs(False, k)
    assert len(configs) == len(set(configs))
    for bn, bk, _, stages in configs:
        assert bn * bk <= bench.ROW_TILE and bk <= triton.next_power_of_2(k)
        assert stages == 1 or bk < k  # one tile spanning K has nothing to pipeline
    widest = max(bn for bn, *_ in configs)
    assert widest > max(bench.ROW_SPACE["block_n"])  # wider column blocks than gemv's one-row search
    assert set(bench._norm_configs(True, k)) <= set(configs)


def test_a_bad_part_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--parts", "gemv,norms"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "--parts takes gemv, silu-mul, norm" in err, err


def test_shapes_are_taken_in_the_order_asked_and_only_among_the_models():
    shapes = [(7168, 1024), (1024, 3584), (248320, 1024)]
    assert bench._asked_shapes("1024x3584,7168x1024", shapes) == [(1024, 3584), (7168, 1024)]
    for bad in ("1024x2048", "1024", "ax3584", "1024x3584x1"):
        with pytest.raises(ValueError, match="decode GEMMs are 7168x1024, 1024x3584, 248320x1024"):
            bench._asked_shapes(bad, shapes)
