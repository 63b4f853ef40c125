"""Benchmark tool: where a plan's time goes inside our JIT-compiled kernels, by sampling.

These machines lend no hardware counters, but Linux's software clock samples (`perf record -e
cpu-clock`) still say which instruction each thread was at. A child process binds the plan
(`bench/steps_in_order.py`'s network and feed), runs it (``--node``: that node's steps only)
over and over for ``--seconds`` while `perf` samples it, then copies its anonymous executable
memory (the code MCJIT loaded) to files. The samples are then put to functions: where a
sample falls in that code, the function is found by matching its bytes against the compiled
objects the engine keeps (`engine.cpu.jit_objects`: ELF files with a symbol for each function
left after inlining, the tasks such as ``pixels_part`` and the internal ones they call, such
as int8's ``requantize``); elsewhere `perf`'s own symbol (Python, NumPy, libc). Code of a
module compiled without keeping its object counts as "[JIT code of no kept object]".
``--annotate N`` disassembles the N hottest JIT functions (`objdump` over the copied bytes)
and lists each one's hottest instructions. A sample lands on the instruction after the one
that stalled as often as on it (skid): read a hot instruction as "around here".

Needs `perf` (and a ``perf_event_paranoid`` that lets a user sample its own process) and
binutils' `objdump`.

    .venv/bin/python bench/jit_profile.py --net resnet50_v2 --precision int8 --node _plus0 \
        --annotate 2
    .venv/bin/python bench/jit_profile.py --net resnet18_v1 --precision bf16 --seconds 10
"""

from __future__ import annotations

import argparse
import bisect
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

SIGNATURE = 48  # bytes of a function's code looked for in the copied memory
WINDOWS = (0, 32, 64, 128)  # where in the function a signature is tried (relocations)
AGREEING = 0.9  # share of a function's bytes a place must hold as compiled (relocations)


def child(options: argparse.Namespace) -> None:
    """The profiled process: bind, say ready, wait for the go, run, copy the JIT code."""
    import steps_in_order

    plan, feed = steps_in_order.build(options)
    if options.node:
        steps = [step for step in plan.steps if step.node.name == options.node]
        if not steps:
            raise SystemExit(f"no step of node {options.node!r} in the plan")
        calls = [step.call for step in steps]

        def work() -> None:
            for call in calls:
                call()
    else:
        def work() -> None:
            plan.run(feed, copy_outputs=False)
    work()
    print("ready", flush=True)
    sys.stdin.readline()
    end, runs = time.monotonic() + options.seconds, 0
    while time.monotonic() < end:
        work()
        runs += 1
    print(f"runs {runs}", flush=True)
    copy_code(Path(options.child))


def copy_code(folder: Path) -> None:
    """Each anonymous executable mapping of this process, as ``code_<start>.bin``."""
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as memory:
        for line in maps:
            fields = line.split()
            path = fields[5] if len(fields) > 5 else ""
            if "x" not in fields[1] or (path and not path.startswith("[anon")):
                continue
            start, end = (int(value, 16) for value in fields[0].split("-"))
            try:
                memory.seek(start)
                (folder / f"code_{start:x}.bin").write_bytes(memory.read(end - start))
            except OSError:
                continue  # a mapping that cannot be read (vsyscall's)


def jit_functions(folder: Path) -> list[tuple[int, int, str]]:
    """(start, end, name) of each kept object's functions found in the copied code."""
    from engine.cpu import cache, jit_objects

    code = [(int(path.stem[5:], 16), path.read_bytes()) for path in folder.glob("code_*.bin")]
    objects = cache.folder(jit_objects.FOLDER)
    found: dict[int, tuple[int, str]] = {}
    for path in sorted(objects.glob("*.o")) if objects else []:
        data = path.read_bytes()
        sections = _code_sections(path)
        for offset, size, name, section in _symbols(path):
            if section not in sections:
                continue
            body = data[sections[section] + offset:][:size]
            for start in _located(body, code):  # a module loaded twice: each copy
                found.setdefault(start, (start + size, f"{name} ({path.stem[:8]})"))
    return sorted((start, end, name) for start, (end, name) in found.items())


def _code_sections(path: Path) -> dict[str, int]:
    """The file offset of each code section of an object (`objdump -h`)."""
    text = subprocess.run(["objdump", "-h", str(path)], capture_output=True, text=True).stdout
    sections, lines = {}, text.splitlines()
    for index, line in enumerate(lines):
        fields = line.split()
        if len(fields) >= 7 and fields[0].isdigit() and index + 1 < len(lines) \
                and "CODE" in lines[index + 1]:
            sections[fields[1]] = int(fields[5], 16)
    return sections


def _symbols(path: Path) -> list[tuple[int, int, str, str]]:
    """(offset, size, name, section) of an object's defined functions (`objdump -t`)."""
    text = subprocess.run(["objdump", "-t", str(path)], capture_output=True, text=True).stdout
    symbols = []
    for line in text.splitlines():
        match = re.match(r"([0-9a-f]+) (.{7}) (\S+)\s+([0-9a-f]+) (\S+)$", line)
        if match and "F" in match.group(2):
            offset, _, section, size, name = match.groups()
            symbols.append((int(offset, 16), int(size, 16), name, section))
    return symbols


def _located(body: bytes, code: list[tuple[int, bytes]]) -> list[int]:
    """Where ``body`` (a function's bytes as compiled) lies in the copied code: the places of
    the first of `WINDOWS` whose `SIGNATURE` bytes occur there, each kept where `AGREEING` of
    the function's bytes are the same (the rest: addresses the loader filled in)."""
    for window in WINDOWS:
        piece = body[window:window + SIGNATURE]
        if len(piece) < SIGNATURE or not piece.strip(b"\0"):
            continue
        places = []
        for start, data in code:
            at = data.find(piece)
            while at >= 0:
                first = at - window
                held = data[first:first + len(body)] if first >= 0 else b""
                if len(held) == len(body) and sum(
                        a == b for a, b in zip(held, body, strict=True)) >= AGREEING * len(body):
                    places.append(start + first)
                at = data.find(piece, at + 1)
        if places:
            return places
    return []


def samples(data: Path) -> list[tuple[int, str]]:
    """(address, perf's symbol) of each sample in ``data``."""
    text = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"],
                          capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        fields = line.split(None, 1)
        if fields:
            out.append((int(fields[0], 16), fields[1].strip() if len(fields) > 1 else "?"))
    return out


def report(taken: list[tuple[int, str]], functions: list[tuple[int, int, str]],
           folder: Path, options: argparse.Namespace) -> None:
    """The samples ``taken`` by function, the `--top` most sampled, and the hottest
    instructions of the `--annotate` most sampled JIT functions; ``folder`` holds the copied
    code."""
    starts = [start for start, _, _ in functions]
    by_function: collections.Counter[str] = collections.Counter()
    by_address: dict[str, collections.Counter[int]] = collections.defaultdict(
        collections.Counter)
    code = [(int(path.stem[5:], 16), path.stat().st_size) for path in folder.glob("code_*.bin")]
    for address, symbol in taken:
        index = bisect.bisect_right(starts, address) - 1
        if index >= 0 and address < functions[index][1]:
            name = functions[index][2]
            by_address[name][address] += 1
        elif any(start <= address < start + size for start, size in code):
            name = "[JIT code of no kept object]"
        else:
            name = symbol
        by_function[name] += 1
    total = max(1, len(taken))
    print(f"{len(taken)} samples; by function (JIT functions: name (object)):")
    for name, count in by_function.most_common(options.top):
        print(f"  {100 * count / total:5.1f}%  {count:7d}  {name}")
    hot = [name for name, _ in by_function.most_common() if name in by_address][:options.annotate]
    for name in hot:
        start, end, _ = next(function for function in functions if function[2] == name)
        print(f"\n{name}: its hottest instructions (% of all samples)")
        for count, line in _annotated(folder, start, end, by_address[name])[:options.lines]:
            print(f"  {100 * count / total:5.2f}%  {line}")


def _annotated(folder: Path, start: int, end: int,
               counts: collections.Counter[int]) -> list[tuple[int, str]]:
    """(samples, objdump's line) of each instruction of the function, hottest first."""
    for path in folder.glob("code_*.bin"):
        base = int(path.stem[5:], 16)
        data = path.read_bytes()
        if base <= start < base + len(data):
            piece = folder / "piece.bin"
            piece.write_bytes(data[start - base:end - base])
            text = subprocess.run(
                ["objdump", "-D", "-b", "binary", "-mi386:x86-64", f"--adjust-vma={start:#x}",
                 str(piece)], capture_output=True, text=True).stdout
            lines = []
            for line in text.splitlines():
                match = re.match(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(.*)$", line)
                if match:
                    lines.append((counts.get(int(match.group(1), 16), 0),
                                  f"{int(match.group(1), 16) - start:#7x}  {match.group(2)}"))
            return sorted(lines, key=lambda pair: -pair[0])
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="resnet18_v1")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "int8"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--node", default="", help="profile this node's steps only")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--frequency", type=int, default=10000, help="samples a second")
    parser.add_argument("--top", type=int, default=20, help="functions listed")
    parser.add_argument("--annotate", type=int, default=0,
                        help="hottest JIT functions whose instructions are listed")
    parser.add_argument("--lines", type=int, default=16, help="instructions listed each")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(options)
        return
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        process = subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:], "--child", scratch],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if process.stdout.readline().strip() != "ready":
            raise SystemExit("the profiled process did not start")
        data = folder / "perf.data"
        perf = subprocess.Popen(
            ["perf", "record", "-e", "cpu-clock", "-F", str(options.frequency),
             "-p", str(process.pid), "-o", str(data), "--", "sleep", str(options.seconds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf attached
        process.stdin.write("go\n")
        process.stdin.flush()
        print(process.stdout.readline().strip(), f"in {options.seconds:g} s")
        process.wait()
        perf.wait()
        if perf.returncode or not data.exists():
            raise SystemExit("perf record failed (perf_event_paranoid, or no perf here)")
        report(samples(data), jit_functions(folder), folder, options)


if __name__ == "__main__":
    main()
