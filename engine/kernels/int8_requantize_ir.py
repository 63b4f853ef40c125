"""The LLVM IR of `int8_conv`'s requantize pass for an AVX2 host, where the output (and the
residual, where one is added) is laid channels-last and every sum plus its bias fits int32
(`int8_conv.INT32_SUMS`): each row of sums into one pixel's output bytes.

``int8_requantize_{out}`` (no residual) and ``int8_requantize_{out}_residual_{residual}``
(``out``, ``residual``: ``i8`` or ``u8``) are `spin_pool` tasks ``(context, part, parts)``
over the rows of sums. ``context`` holds int64s (`FIELDS`): the sums', bias', scales',
output's and residual's addresses, the rows, the filters, the sums' row length, the output
position of row 0, then float64 bits: the activation's bounds, the residual's scale and the
last clamp's bounds. The same names ending ``_rescaled`` also write a second output
(`int8_conv.Rescaled`: ResNet v2's next pre-activation BatchNorm and relu), whose address
and per-filter scales' and shifts' addresses follow in the context (`RESCALED_FIELDS`):
each code of the first output, as its type reads it, times its filter's scale plus its
shift (a multiply then an add, as `int8_affine`'s pass makes them), clamped to uint8 and
rounded half to even, from the codes still in registers, so that no pass reads the first
output again.

The arithmetic is `int8_conv._requantize`'s step for step: the int32 sum plus the bias,
converted to float32, times the scale; with a residual, clamped to the activation, plus the
residual's scale times the residual (a multiply then an add, never fused); clamped to the
last bounds (the activation after the sum folded into the saturation, or without a residual
every bound in one), rounded half to even as ``vcvtps2dq`` converts in the default rounding
mode. The clamp keeps every code inside the output type, so the saturating packs (``vpackssdw``
then ``vpackuswb`` or ``vpacksswb``) narrow 32 codes to bytes in three instructions and a
``vpermd`` that puts back the order they take within each 128-bit lane, where numba's loop
spends four shuffles on every eight. A row's filters go 32 at a time, then 8 at a time: the
filters must be a multiple of 8 (`supported`).
"""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from engine.kernels.task_ir import F32, I32, I64, as_float, fields, loop, splat, task

I8, I16 = ir.IntType(8), ir.IntType(16)
STEP = 32  # codes a whole step packs: four vectors of eight
LANES = 8  # float32 in a ymm register
FIELDS = ("sums", "bias", "scales", "out", "residual", "rows", "filters", "columns", "offset",
          "act_low", "act_top", "residual_scale", "low", "high")
# a `_rescaled` task's context words past `FIELDS`: the second output's address, and its
# float32 scales' and shifts' (one a filter)
RESCALED_FIELDS = FIELDS + ("second", "second_scales", "second_shifts")
# `vpermd`'s order undoing the packs' interleaving of 4-code groups within 128-bit lanes
UNPACKED = [0, 4, 1, 5, 2, 6, 3, 7]
SIGNS = {True: "i8", False: "u8"}


def task_name(out_signed: bool, residual_signed: bool | None = None,
              rescaled: bool = False) -> str:
    """The task for an output of this signedness, with a residual of that one (None: no
    residual), writing the rescaled second output too where ``rescaled``."""
    name = f"int8_requantize_{SIGNS[out_signed]}"
    if residual_signed is not None:
        name = f"{name}_residual_{SIGNS[residual_signed]}"
    return f"{name}_rescaled" if rescaled else name


def supported(filters: int) -> bool:
    """Whether the tasks cover a row of ``filters`` sums: whole steps of eight."""
    return filters % LANES == 0


def module() -> ir.Module:
    """A module holding every task `task_name` names."""
    built = ir.Module(name="hybridserve_int8_requantize")
    kernel = _RequantizeKernel(built)
    for rescaled in (False, True):
        for out_signed in (True, False):
            for residual_signed in (None, True, False):
                kernel.define(out_signed, residual_signed, rescaled)
    return built


class _RequantizeKernel:
    def __init__(self, built: ir.Module) -> None:
        self.module = built
        self.words = ir.VectorType(I32, LANES)
        self.floats = ir.VectorType(F32, LANES)
        halves = ir.VectorType(I16, 2 * LANES)
        self.convert = ir.Function(built, ir.FunctionType(self.words, [self.floats]),
                                   name="llvm.x86.avx.cvt.ps2dq.256")
        self.pack_words = ir.Function(built, ir.FunctionType(halves, [self.words] * 2),
                                      name="llvm.x86.avx2.packssdw")
        self.pack_bytes = {signed: ir.Function(built, ir.FunctionType(
            ir.VectorType(I8, STEP), [halves] * 2), name=f"llvm.x86.avx2.{name}")
            for signed, name in ((True, "packsswb"), (False, "packuswb"))}

    def define(self, out_signed: bool, residual_signed: bool | None,
               rescaled: bool = False) -> None:
        function, builder, context, part, parts = task(
            self.module, task_name(out_signed, residual_signed, rescaled))
        field = fields(builder, context, RESCALED_FIELDS if rescaled else FIELDS)
        self.builder, self.residual_signed = builder, residual_signed
        if rescaled:
            self.second = builder.inttoptr(field["second"], I8.as_pointer())
            self.second_scales = builder.inttoptr(field["second_scales"], F32.as_pointer())
            self.second_shifts = builder.inttoptr(field["second_shifts"], F32.as_pointer())
            self.byte_bounds = tuple(ir.Constant(self.floats, [bound] * LANES)
                                     for bound in (0.0, 255.0))
        self.sums = builder.inttoptr(field["sums"], I32.as_pointer())
        self.bias = builder.inttoptr(field["bias"], I32.as_pointer())
        self.scales = builder.inttoptr(field["scales"], F32.as_pointer())
        self.out = builder.inttoptr(field["out"], I8.as_pointer())
        self.residual = builder.inttoptr(field["residual"], I8.as_pointer())
        self.bounds = {name: splat(builder, as_float(builder, field[name]), self.floats)
                       for name in ("act_low", "act_top", "residual_scale", "low", "high")}
        filters = field["filters"]
        whole = builder.mul(builder.sdiv(filters, I64(STEP)), I64(STEP))
        first = builder.sdiv(builder.mul(part, field["rows"]), parts)
        last = builder.sdiv(builder.mul(builder.add(part, I64(1)), field["rows"]), parts)
        with loop(builder, function, first, last, "row") as row:
            line = builder.mul(row, field["columns"])
            laid = builder.mul(builder.add(row, field["offset"]), filters)
            with loop(builder, function, I64(0), whole, "step", STEP) as at:
                starts, codes = [], []
                for quarter in range(STEP // LANES):
                    starts.append(builder.add(at, I64(quarter * LANES)))
                    codes.append(self._codes(line, laid, starts[-1]))
                self._store(self._pack(codes[:2], codes[2:], out_signed), self.out, laid, at,
                            STEP)
                if rescaled:
                    seconds = [self._rescaled(code, start)
                               for code, start in zip(codes, starts, strict=True)]
                    self._store(self._pack(seconds[:2], seconds[2:], False), self.second,
                                laid, at, STEP)
            with loop(builder, function, whole, filters, "eight", LANES) as at:
                codes = self._codes(line, laid, at)
                self._store(self._eight(codes, out_signed), self.out, laid, at, LANES)
                if rescaled:
                    self._store(self._eight(self._rescaled(codes, at), False), self.second,
                                laid, at, LANES)
        builder.ret_void()

    def _eight(self, codes: Any, signed: bool) -> Any:
        """Eight codes as eight bytes in order (two int32 words)."""
        return self.builder.shuffle_vector(
            self._pack([codes, codes], [codes, codes], signed),
            ir.Constant(self.words, ir.Undefined), ir.Constant(ir.VectorType(I32, 2), [0, 1]))

    def _rescaled(self, codes: Any, filter_at: Any) -> Any:
        """The second output's eight codes (int32, within uint8) from eight codes of the
        first (int32, each as the output's type reads it) of filters from ``filter_at``:
        ``code · scale + shift``, clamped to uint8's bounds, rounded half to even (rounding
        commutes with clamping to integer bounds)."""
        builder = self.builder
        value = builder.fadd(builder.fmul(builder.sitofp(codes, self.floats), self._load(
            self.second_scales, filter_at, self.floats, 4)), self._load(
            self.second_shifts, filter_at, self.floats, 4))
        return builder.call(self.convert, [self._clamp(value, *self.byte_bounds)])

    def _load(self, base: Any, at: Any, vector: ir.VectorType, align: int) -> Any:
        builder = self.builder
        return builder.load(builder.bitcast(builder.gep(base, [at]), vector.as_pointer()),
                            align=align)

    def _codes(self, line: Any, laid: Any, filter_at: Any) -> Any:
        """Eight filters' codes (int32) from filter ``filter_at`` of the sums' row at
        element ``line``, output position ``laid``."""
        builder, bounds = self.builder, self.bounds
        sums = self._load(self.sums, builder.add(line, filter_at), self.words, 4)
        value = builder.fmul(builder.sitofp(builder.add(sums, self._load(
            self.bias, filter_at, self.words, 4)), self.floats),
            self._load(self.scales, filter_at, self.floats, 4))
        if self.residual_signed is not None:
            value = self._clamp(value, bounds["act_low"], bounds["act_top"])
            summands = self._load(self.residual, builder.add(laid, filter_at),
                                  ir.VectorType(I8, LANES), 1)
            widen = builder.sitofp if self.residual_signed else builder.uitofp
            value = builder.fadd(value, builder.fmul(bounds["residual_scale"],
                                                     widen(summands, self.floats)))
        return builder.call(self.convert, [self._clamp(value, bounds["low"], bounds["high"])])

    def _clamp(self, value: Any, low: Any, high: Any) -> Any:
        """``min(max(value, low), high)``: as numba's ``min`` and ``max`` for every value
        but a zero's sign at a zero bound (the same code), in the form ``vmaxps`` and
        ``vminps`` take (a compare and a blend each otherwise)."""
        builder = self.builder
        value = builder.select(builder.fcmp_ordered(">", value, low), value, low)
        return builder.select(builder.fcmp_ordered("<", value, high), value, high)

    def _pack(self, first: list[Any], second: list[Any], signed: bool) -> Any:
        """Four vectors of codes as 32 bytes in order (eight int32 words)."""
        builder = self.builder
        packed = builder.call(self.pack_bytes[signed], [builder.call(self.pack_words, first),
                                                        builder.call(self.pack_words, second)])
        return builder.shuffle_vector(builder.bitcast(packed, self.words),
                                      ir.Constant(self.words, ir.Undefined),
                                      ir.Constant(self.words, UNPACKED))

    def _store(self, words: Any, base: Any, laid: Any, at: Any, count: int) -> None:
        """The first ``count`` bytes of ``words`` at element ``laid + at`` of the output
        at ``base``."""
        builder = self.builder
        address = builder.gep(base, [builder.add(laid, at)])
        vector = ir.VectorType(I32, count // 4)
        builder.store(words, builder.bitcast(address, vector.as_pointer()), align=1)
