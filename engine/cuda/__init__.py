"""GPU execution through CuPy: fused-kernel generation, plan execution and CUDA graph replay.

`codegen` is pure Python (tested without a GPU); `fused`, `executor` and `graphs` use CuPy only
when a GPU plan is built. Importing this package registers its array module with
`engine.device` (`use_gpu_array_module`), which never imports it. (Named ``cuda`` so that
``engine.gpu(0)``, MXNet's context constructor, stays a plain function.)
"""

from engine.cuda.array_module import capturable
from engine.device import use_gpu_array_module

use_gpu_array_module(capturable)
