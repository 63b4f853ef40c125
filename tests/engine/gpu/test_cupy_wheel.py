"""The GPU path against the real CuPy and cuDNN frontend wheels, on a machine without a GPU.

What needs no device is checked for real: CuPy's namespace (which the stand-in mirrors), its
``matmul`` and ``ElementwiseKernel`` signatures and parameter grammar, that every generated
fused kernel compiles with NVRTC in CuPy's headers, that cuDNN's graph description infers the
plan's convolution shapes, and that no CUDA 12 library joins a CUDA 13 process.

The wheels are large, so this module runs in its own environment: ``make cupy-check``. In the
project's environment (no CuPy) it skips; ``HYBRIDSERVE_REQUIRE_CUPY_WHEEL=1`` makes that skip a
failure, as ``make cupy-check`` sets it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.cuda import cudnn_conv
from engine.cuda.codegen import fused_source
from engine.kernels.gemm_bind import matmul_into
from engine.kernels.im2col import conv_out_sizes
from tests.engine.gpu import fake_cupy
from tests.engine.gpu.test_codegen import FUSABLE, step

if os.environ.get("HYBRIDSERVE_REQUIRE_CUPY_WHEEL", "").strip() not in ("", "0"):
    import cupy
else:
    cupy = pytest.importorskip("cupy", reason="the CuPy wheel is not installed here; run "
                                              "`make cupy-check` to test against it")

ARCH = "compute_80"  # any architecture NVRTC knows: the check is that the source compiles


def test_the_stand_in_knows_exactly_cupys_names() -> None:
    names = sorted(name for name in dir(cupy) if not name.startswith("_"))
    assert sorted(fake_cupy.CUPY_NAMES) == names, (
        "tests/engine/gpu/cupy_names.txt is out of date with this CuPy; regenerate it")


def test_matmul_takes_out_by_keyword_only() -> None:
    host = np.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match="multiple values for argument 'out'"):
        cupy.matmul(host, host, host)
    # The bound call passes the argument checks; it fails only at the host array itself.
    with pytest.raises(TypeError, match="`out` must be a tuple or `cupy.ndarray`"):
        matmul_into(cupy, host, host, host)()


def test_device_arrays_have_neither_array_interface_nor_writeable() -> None:
    from cupy._core.flags import Flags

    assert not hasattr(cupy.ndarray, "__array_interface__")
    assert not hasattr(Flags, "writeable")
    public = {name for name in dir(Flags) if not name.startswith("_")}
    assert {"c_contiguous", "f_contiguous", "owndata"} <= public


@pytest.mark.parametrize("extra", ["float16", "float32", "float64", "int32", "int64", "bool"])
def test_generated_parameters_parse_with_cupys_grammar(extra: str) -> None:
    chain = (step("elemwise_add"), step("elemwise_mul", position=1), step("relu"))
    source = fused_source(chain, np.float32, [np.dtype(extra)] * 2)
    kernel = cupy.ElementwiseKernel(source.in_params, source.out_params, source.operation,
                                    source.name)
    assert [param.dtype for param in kernel.in_params] == [np.dtype(extra).type] * 2
    assert [param.ctype for param in kernel.out_params] == ["Y"]
    fake_cupy.ElementwiseKernel(source.in_params, source.out_params, source.operation,
                                source.name)  # the stand-in agrees


def test_every_generated_kernel_compiles_with_nvrtc() -> None:
    nvrtc = _nvrtc()
    kernels = []
    for index, (_, fused) in enumerate(FUSABLE):
        for out_dtype in (np.float32, np.float16, np.float64):
            source = fused_source((fused,), out_dtype, [np.dtype(np.float16)] * (fused.arity - 1))
            kernels.append(_as_cuda(f"k{index}_{np.dtype(out_dtype).name}", source, out_dtype))
    program = nvrtc.createProgram("\n".join(_PRELUDE + kernels), "fused.cu", (), ())
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture={ARCH}", "-std=c++17",
                                       *(f"-I{path}" for path in _include_dirs())])
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(program))
    finally:
        nvrtc.destroyProgram(program)


@pytest.mark.parametrize("geometry,group,bias,dims", [
    (((3, 3), (1, 1), (1, 1), (1, 1)), 1, True, 2),
    (((7, 7), (2, 2), (1, 1), (3, 3)), 1, False, 2),
    (((3, 3), (1, 1), (2, 2), (2, 2)), 2, True, 2),
    (((1, 1), (2, 2), (1, 1), (0, 0)), 1, True, 2),
    (((3, 3, 3), (1, 2, 2), (1, 1, 1), (1, 1, 1)), 1, True, 3),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])  # fp32 plans, and fp16 (half.py)
def test_cudnn_graph_infers_the_plans_convolution_shape(geometry: Any, group: int, bias: bool,
                                                         dims: int, dtype: Any) -> None:
    cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    kernel, stride, dilate, pad = geometry
    data = np.zeros((2, 4, *(9,) * dims), dtype)
    size = conv_out_sizes(data.shape[2:], kernel, stride, dilate, pad)
    weight = np.zeros((6, 4 // group, *kernel), dtype)
    out = np.zeros((2, 6, *size), dtype)
    assert cudnn_conv.supports(data, weight, out, geometry)
    graph, tensors = cudnn_conv.describe(cudnn, data, weight, np.zeros(6, dtype) if bias
                                         else None, out, geometry, tf32=False)
    assert list(tensors["out"].get_dim()) == list(out.shape)
    assert list(tensors["out"].get_stride()) == cudnn_conv.element_strides(out)
    assert ("bias" in tensors) is bias


@pytest.mark.parametrize("bias", [True, False])
def test_cudnn_describes_a_convolution_on_bf16_operands(bias: bool) -> None:
    cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    data, weight = np.zeros((2, 4, 9, 9), np.uint16), np.zeros((6, 4, 3, 3), np.uint16)
    out = np.zeros((2, 6, 9, 9), np.float32)
    graph, tensors = cudnn_conv.describe(cudnn, data, weight, np.zeros(6, np.float32) if bias
                                         else None, out, geometry, tf32=False,
                                         bf16_operands=True)
    assert list(tensors["out"].get_dim()) == list(out.shape)


def test_the_bf16_conversion_kernel_compiles_with_nvrtc() -> None:
    from engine.cuda.bf16 import KERNEL_NAME, TO_BF16

    kernel = cupy.ElementwiseKernel("float32 x", "uint16 y", TO_BF16, KERNEL_NAME)
    assert [param.dtype for param in kernel.in_params] == [np.float32]
    source = ("extern \"C\" __global__ void convert(const float* xs, unsigned short* ys, "
              "int n) {\n  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "  if (i >= n) return;\n  const float x = xs[i];\n  unsigned short y;\n"
              f"  {{ {TO_BF16} }}\n  ys[i] = y;\n}}\n")
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(source, "to_bf16.cu", (), ())
    try:  # no include directories: the conversion needs no CUDA header
        nvrtc.compileProgram(program, [f"--gpu-architecture={ARCH}", "-std=c++17"])
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(program))
    finally:
        nvrtc.destroyProgram(program)


def test_no_cuda_12_library_in_a_cuda_13_process() -> None:
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    assert cupy.cuda.get_local_runtime_version() // 1000 == 13
    maps = Path("/proc/self/maps").read_text()
    assert ".so.12" not in "".join(line for line in maps.splitlines() if "/nvidia/" in line
                                   or "libcu" in line or "libnv" in line)


_PRELUDE = ["#include <cupy/carray.cuh>", "#include <cupy/float16.cuh>"]


def _as_cuda(name: str, source: Any, out_dtype: Any) -> str:
    """The body in a kernel shaped like CuPy's elementwise ones: a typedef per placeholder,
    each parameter a reference named as in the body."""
    ctype = {"float16": "float16", "float32": "float", "float64": "double"}
    extras = [param.split() for param in source.in_params.split(", ") if param]
    arguments = ", ".join([f"const {ctype[t]}* _{n}" for t, n in extras] + ["Y* _y", "int n"])
    bindings = " ".join(f"const {ctype[t]} &{n} = _{n}[i];" for t, n in extras)
    return (f"namespace {name} {{ typedef {ctype[np.dtype(out_dtype).name]} Y;\n"
            f'extern "C" __global__ void {name}({arguments}) {{\n'
            f"int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;\n"
            f"{bindings} Y &y = _y[i];\n{source.operation}\n}} }}")


def _nvrtc() -> Any:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as error:  # the NVRTC wheel is missing or unloadable
        pytest.skip(f"NVRTC cannot be loaded ({error}); install nvidia-cuda-nvrtc")
    return nvrtc


def _include_dirs() -> list[Path]:
    """CuPy's headers and the CUDA headers (``cuda_fp16.h``) of the CUDA runtime wheel."""
    dirs = [Path(cupy.__file__).parent / "_core" / "include"]
    try:
        import nvidia.cu13 as cu13  # the CUDA 13 wheels' shared prefix
    except ImportError:
        pytest.skip("the CUDA 13 headers are missing; install nvidia-cuda-runtime")
    dirs += [Path(path) / "include" for path in cu13.__path__]
    if not any((path / "cuda_fp16.h").exists() for path in dirs):
        pytest.skip("cuda_fp16.h is missing; install nvidia-cuda-runtime")
    return dirs


def test_the_cudnn_stand_in_uses_only_what_the_frontend_has() -> None:
    import inspect

    from tests.engine.gpu import fake_cudnn

    cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    fake = fake_cudnn.make()
    for name in ("pygraph", "create_handle", "set_stream", "backend_version",
                 "cudnnGraphNotSupportedError"):
        assert hasattr(cudnn, name), name
    for space, members in (("data_type", ("FLOAT", "HALF")), ("numerical_note", ("TENSOR_CORE",)),
                           ("heur_mode", ("A", "FALLBACK"))):
        assert all(hasattr(getattr(cudnn, space), member) for member in members), space
        assert all(hasattr(getattr(fake, space), member) for member in members), space
    for method in ("tensor", "conv_fprop", "bias", "deselect_numeric_notes", "build",
                   "get_workspace_size", "execute"):
        real = inspect.signature(getattr(cudnn.pygraph, method)).parameters
        stand_in = inspect.signature(getattr(fake_cudnn.Graph, method)).parameters
        keywords = any(p.kind is p.VAR_KEYWORD for p in real.values())
        assert keywords or set(stand_in) <= set(real), (method, list(real), list(stand_in))
    tensor_methods = ("get_dim", "get_stride", "set_output", "set_data_type", "set_dim",
                      "set_stride")
    from cudnn.graph_types import Tensor

    assert all(hasattr(Tensor, name) for name in tensor_methods)
    assert list(inspect.signature(cudnn.set_stream).parameters) == ["handle", "stream"]
