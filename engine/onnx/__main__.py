"""``python -m engine.onnx SYMBOL PARAMS OUT`` (and ``hybridserve export-onnx``): write ONNX."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engine.errors import EngineError


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``data=1,3,224,224`` → ``("data", (1, 3, 224, 224))``."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(dim) for dim in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad --input-shape {text!r}; expected NAME=D0,D1,... such as data=1,3,224,224"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    from engine.onnx.export import DEFAULT_OPSET

    parser = argparse.ArgumentParser(
        prog="hybridserve export-onnx",
        description="Convert an MXNet export (symbol JSON + params) to ONNX with a dynamic batch.")
    parser.add_argument("symbol", help="NAME-symbol.json")
    parser.add_argument("params", help="NAME-0000.params")
    parser.add_argument("out", help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                        help=f"ONNX opset, 17 to 21 (default {DEFAULT_OPSET})")
    parser.add_argument("--input-shape", action="append", type=parse_input_shape, default=[],
                        metavar="NAME=D0,D1,...",
                        help="example shape of an input whose size the files do not fix "
                             "(repeatable); the batch dimension stays dynamic")
    parser.add_argument("--static-batch", action="store_true",
                        help="keep every input shape exactly as given")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return the exit status (2 with a message on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        from engine.onnx.export import export

        path = export((args.symbol, args.params), args.out, opset=args.opset,
                      input_shapes=dict(args.input_shape), dynamic_batch=not args.static_batch)
    except ImportError as error:
        print(f"export-onnx needs the onnx package (pip install 'hybridserve[onnx]'): {error}",
              file=sys.stderr)
        return 2
    except EngineError as error:
        print(f"export-onnx: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
