"""Where each thread of a py-spy raw profile (``record -f raw --threads --idle``) spends time.

    python bench/spy_summary.py spy.txt

Prints samples per thread, the most sampled innermost frames per thread, and the engine and
service frames by inclusive samples: a thread's samples minus its idle frames (``_worker``,
``Runner.run``) is how busy it was.
"""

from __future__ import annotations

import sys
from collections import Counter


def main(path: str) -> None:
    threads: Counter[str] = Counter()
    innermost: Counter[tuple[str, str]] = Counter()
    ours: Counter[tuple[str, str]] = Counter()
    with open(path) as profile:
        for line in profile:
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            thread, samples = frames[0][:50], int(count)
            threads[thread] += samples
            innermost[thread, frames[-1][:120]] += samples
            for frame in set(frames[1:]):
                if "engine/" in frame or "service/" in frame:
                    ours[thread, frame[:120]] += samples
    print("samples per thread:", threads.most_common())
    print("--- innermost frames")
    for (thread, frame), samples in innermost.most_common(30):
        print(f"{samples:6d}  {thread}  {frame}")
    print("--- engine and service frames, inclusive")
    for (thread, frame), samples in ours.most_common(40):
        print(f"{samples:6d}  {thread}  {frame}")


if __name__ == "__main__":
    main(sys.argv[1])
