"""A walk through the code of Gluon's hybridize tutorials, in order, on HybridServe.

The tutorials (their code is reproduced here; nothing is read from outside this file):

- ``000``: Dive into Deep Learning (MXNet edition), "A Hybrid of Imperative and Symbolic
  Programming", with the NDArray API (the Chinese edition's chapter has the same code);
- ``001``: The Straight Dope, "Fast, portable neural networks with Gluon HybridBlocks";
- ``002``: Dive into Deep Learning, "Compilers and Interpreters", with the NumPy API
  (``np``/``npx``);
- ``003``: Apache MXNet's guide "Hybridize", its "Key differences and limitations of
  hybridization".

Each tutorial's code runs with ``from engine import nd, sym`` / ``from engine.gluon import nn`` /
``from engine import np, npx`` in place of the mxnet imports and prints what the tutorial
prints, including the "before/after hybridizing" timing of 1000 forward passes. Exported files
go to a temporary directory. Run: ``python examples/hybridize_tour.py [--passes 1000]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from engine import nd, np, npx, sym
from engine.gluon import HybridBlock, nn


def section(title: str) -> None:
    """Print a section header."""
    print(f"\n===== {title} =====")


# --- 000 and 003: imperative versus symbolic programs --------------------------------------------
def imperative_and_symbolic() -> int:
    """``fancy_func`` run directly, then as a program text compiled and executed."""
    def add(a: int, b: int) -> int:
        return a + b

    def fancy_func(a: int, b: int, c: int, d: int) -> int:
        e = add(a, b)
        f = add(c, d)
        return add(e, f)

    print(fancy_func(1, 2, 3, 4))

    def add_str() -> str:
        return "\ndef add(a, b):\n    return a + b\n"

    def fancy_func_str() -> str:
        return ("\ndef fancy_func(a, b, c, d):\n    e = add(a, b)\n    f = add(c, d)\n"
                "    g = add(e, f)\n    return g\n")

    def evoke_str() -> str:
        return add_str() + fancy_func_str() + "\nprint(fancy_func(1, 2, 3, 4))\n"

    prog = evoke_str()
    print(prog)
    y = compile(prog, "", "exec")
    exec(y, {})  # noqa: S102 - the tutorial's own demonstration of compiling a program text
    return fancy_func(1, 2, 3, 4)


def get_net() -> nn.HybridSequential:
    """The tutorials' MLP."""
    net = nn.HybridSequential()  # Here we use the class HybridSequential
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def benchmark(net: Any, x: Any, passes: int = 1000) -> float:
    """Seconds for ``passes`` forward passes (the tutorials' ``benchmark``)."""
    start = time.time()
    for _ in range(passes):
        _ = net(x)
    nd.waitall()  # To facilitate timing, we wait for all computations to be completed
    return time.time() - start


class HybridNet(nn.HybridBlock):
    """The tutorials' HybridNet: prints F, x and the hidden layer while running."""

    def __init__(self, hidden: int = 10, relu: str = "relu", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._relu = relu
        self.hidden = nn.Dense(hidden)
        self.output = nn.Dense(2)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        print("F: ", F)
        print("x: ", x)
        x = F.npx.relu(self.hidden(x)) if self._relu == "npx" else F.relu(self.hidden(x))
        print("hidden: ", x)
        return self.output(x)


def d2l_nd(workdir: str, passes: int) -> dict[str, Any]:
    """Tutorial 000 (and 003's first half): HybridSequential, timing, export, HybridNet."""
    section("d2l, NDArray: HybridSequential")
    x = nd.random.normal(shape=(1, 512))
    net = get_net()
    before = net(x)
    print(before)
    net.hybridize()
    after = net(x)
    print(after)
    section("d2l, NDArray: computing performance")
    net = get_net()
    print(f"before hybridizing: {benchmark(net, x, passes):.4f} sec")
    net.hybridize()
    print(f"after hybridizing: {benchmark(net, x, passes):.4f} sec")
    section("d2l, NDArray: export")
    paths = net.export(os.path.join(workdir, "my_mlp"))
    print("wrote", ", ".join(os.path.basename(path) for path in paths))
    symbolic = net(sym.var("data"))
    print(symbolic)
    section("d2l, NDArray: HybridNet")
    hybrid = HybridNet()
    hybrid.initialize()
    small = nd.random.normal(shape=(1, 4))
    first = hybrid(small)
    print(first)
    print(hybrid(small))
    hybrid.hybridize()
    print(hybrid(small))
    print(hybrid(small))
    return {"before": before, "after": after, "export": paths, "symbol": symbolic,
            "mlp": net, "x": x}


# --- 001: The Straight Dope ----------------------------------------------------------------------
class Net(HybridBlock):
    """The Straight Dope's Net: prints the input type and F's name."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.fc1 = nn.Dense(256)
            self.fc2 = nn.Dense(128)
            self.fc3 = nn.Dense(2)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        # F is a function space that depends on the type of x
        print(f"type(x): {type(x).__name__}, F: {F.__name__}")
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def straight_dope(workdir: str, passes: int) -> dict[str, Any]:
    """Tutorial 001: name_scope, collect_params().initialize(), tojson, save, hybrid_forward."""
    def get_scoped_net() -> nn.HybridSequential:
        net = nn.HybridSequential()
        with net.name_scope():
            net.add(nn.Dense(256, activation="relu"))
            net.add(nn.Dense(128, activation="relu"))
            net.add(nn.Dense(2))
        net.collect_params().initialize()
        return net

    section("The Straight Dope: HybridSequential")
    x = nd.random_normal(shape=(1, 512))
    net = get_scoped_net()
    print(f"=== net(x) ==={net(x)}")
    net.hybridize()
    print(f"=== net(x) ==={net(x)}")
    section("The Straight Dope: performance")
    net = get_scoped_net()
    nd.waitall()
    print(f"Before hybridizing: {benchmark(net, x, passes):.4f} sec")
    net.hybridize()
    print(f"After hybridizing: {benchmark(net, x, passes):.4f} sec")
    section("The Straight Dope: the symbolic program")
    data = sym.var("data")
    print("=== input data holder ===")
    print(data)
    y = net(data)
    print("\n=== the symbolic program of net===")
    print(y)
    y_json = y.tojson()
    print("\n=== the according json definition===")
    print(y_json)
    y.save(os.path.join(workdir, "model.json"))
    net.save_params(os.path.join(workdir, "model.params"))
    section("The Straight Dope: HybridBlock")
    hybrid = Net()
    hybrid.collect_params().initialize()
    x = nd.random_normal(shape=(1, 512))
    print("=== 1st forward ===")
    hybrid(x)
    print("=== 2nd forward ===")
    hybrid(x)
    hybrid.hybridize()
    print("=== 1st forward ===")
    hybrid(x)
    print("=== 2nd forward ===")
    hybrid(x)
    return {"json": y_json, "net": net, "x": x}


# --- 002: d2l with np/npx ------------------------------------------------------------------------
class Benchmark:
    """Tutorial 002's ``benchmark`` context manager (d2l.Timer replaced by time.perf_counter)."""

    def __init__(self, description: str = "Done in %.4f sec") -> None:
        self.description = description

    def __enter__(self) -> Benchmark:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *args: Any) -> None:
        print(self.description % (time.perf_counter() - self.start))


def d2l_np(workdir: str, passes: int) -> dict[str, Any]:
    """Tutorial 002: the same MLP in NumPy mode, export and a look at the files, HybridNet."""
    npx.set_np()
    section("d2l, np/npx: HybridSequential")
    x = np.random.normal(size=(1, 512))
    net = get_net()
    print(net(x))
    net.hybridize()
    print(net(x))
    net = get_net()
    with Benchmark("Without hybridization: %.4f sec"):
        for _ in range(passes):
            net(x)
        npx.waitall()
    net.hybridize()
    with Benchmark("With    hybridization: %.4f sec"):
        for _ in range(passes):
            net(x)
        npx.waitall()
    section("d2l, np/npx: serialization")
    base = os.path.join(workdir, "np_mlp")
    net.export(base)
    for path in sorted(os.listdir(workdir)):
        if path.startswith("np_mlp"):  # !ls -lh my_mlp*
            print(f"{os.path.getsize(os.path.join(workdir, path)):>8}  {path}")
    with open(base + "-symbol.json", encoding="utf-8") as handle:  # !head my_mlp-symbol.json
        print("".join(handle.readlines()[:10]))
    section("d2l, np/npx: HybridNet (F.npx.relu)")
    hybrid = HybridNet(hidden=4, relu="npx")
    hybrid.initialize()
    small = np.random.normal(size=(1, 3))
    print(hybrid(small))
    hybrid.hybridize()
    print(hybrid(small))
    print(hybrid(small))
    npx.reset_np()
    return {"net": net}


# --- 003: limitations ----------------------------------------------------------------------------
class Limited(HybridBlock):
    """A block whose hybrid_forward does one thing a Symbol cannot."""

    def __init__(self, body: Any) -> None:
        super().__init__()
        self._body = body

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return self._body(F, x)


def _set_first(F: Any, x: Any) -> Any:  # noqa: N803
    x[0] = 2
    return x


def _in_place(F: Any, x: Any) -> Any:  # noqa: N803
    x += 1
    return x


LIMITATIONS: dict[str, Any] = {
    "indexing x[0, 0]": lambda F, x: x[0, 0],
    "x.dtype": lambda F, x: x if x.dtype == "float16" else x * 2,
    "x.context": lambda F, x: x if x.context == nd.cpu() else x * 2,
    "x.shape": lambda F, x: x * x.shape[0],
    "item assignment x[0] = 2": _set_first,
    "x.asnumpy()": lambda F, x: x.asnumpy(),
    "in-place x += 1": _in_place,
    "if on a Symbol": lambda F, x: x if x else x * 2,
}


def limitations() -> dict[str, Exception]:
    """Tutorial 003: each limitation works imperatively and raises a clear error once hybridized."""
    section("MXNet's Hybridize guide: limitations of hybridization")
    errors = {}
    x = nd.array([[1.0, 2.0, 3.0]])
    for title, body in LIMITATIONS.items():
        block = Limited(body)
        block.hybridize()
        try:
            block(x)
        except (AttributeError, TypeError) as error:
            errors[title] = error
            print(f"{title}: {type(error).__name__}: {error}")
    x = nd.array([1, 2, 3])
    value = nd.ones_like(x) * 2
    condition = nd.array([0, 1, 1])
    print(nd.where(condition=condition, x=x, y=value))
    return errors


def tour(passes: int = 1000) -> dict[str, Any]:
    """Run every tutorial in order; return what each produced, by its key above (for tests)."""
    with tempfile.TemporaryDirectory() as workdir:
        print("imperative and symbolic programs:")
        results = {"fancy": imperative_and_symbolic(), "000": d2l_nd(workdir, passes)}
        results["001"] = straight_dope(workdir, passes)
        results["002"] = d2l_np(workdir, passes)
        results["003"] = limitations()
        results["files"] = sorted(os.listdir(workdir))
    return results


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--passes", type=int, default=1000)
    tour(parser.parse_args().passes)


if __name__ == "__main__":
    main()
