"""`bench/variants.py`: a kernel's variant bound beside the kernel as it is."""

from __future__ import annotations

import pytest

from bench import variants
from engine.kernels import gemm_bf16_ir


def test_a_setting_names_the_attribute_it_sets_through_a_dotted_path() -> None:
    holder, name, value = variants.parse_setting(
        "engine.kernels.gemm_bf16_ir:PairTileKernel.asks_large_c=False")
    assert holder is gemm_bf16_ir.PairTileKernel
    assert name == "asks_large_c" and value is False


@pytest.mark.parametrize("text", ["engine.kernels.gemm_bf16_ir:PairTileKernel.no_such=1",
                                  "engine.kernels.gemm_bf16_ir=1",
                                  "engine.kernels.gemm_bf16_ir:PairTileKernel.asks_large_c"])
def test_a_setting_that_names_nothing_is_refused_with_what_it_expected(text: str) -> None:
    with pytest.raises(SystemExit, match="--set"):
        variants.parse_setting(text)
