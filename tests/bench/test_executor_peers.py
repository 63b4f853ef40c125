"""`bench/executor.py`'s peer table: its options, the top-1 agreement, the row it prints, and
the protocol of the peers that run in their own environment (`bench/quantized_peers.py`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import executor, quantized_peers
from engine.cpu import host_features, spin_pool
from engine.runtime.plan import Plan
from tests.engine.compiler.graphs import conv_bn_relu


def test_peers_option_takes_a_list_or_all_and_always_keeps_ort_first() -> None:
    assert executor.parse_peers("all") == ("ort", "int8", *quantized_peers.RUNTIMES)
    assert executor.parse_peers("int8") == ("ort", "int8")
    assert executor.parse_peers("ov-bf16, ort-int8,ov-bf16") == ("ort", "ov-bf16", "ort-int8")
    assert executor.parse_peers("ort") == ("ort",)
    assert executor.parser().parse_args([]).peers == ("ort",)
    with pytest.raises(argparse.ArgumentTypeError, match="ov-f16"):
        executor.parse_peers("ov-f32,ov-f16")


def test_cases_option_names_the_bad_case() -> None:
    assert executor.parse_cases("precision") == executor.PRECISION_CASES
    assert executor.parse_cases("default") == executor.PEER_CASES
    assert executor.parse_cases("resnet18_v1:8, mlp:64") == (("resnet18_v1", 8), ("mlp", 64))
    for bad in ("resnet18:1", "mlp:0", "mlp", "mlp:x"):
        with pytest.raises(argparse.ArgumentTypeError, match=bad):
            executor.parse_cases(bad)
    assert executor.parser().parse_args(["--cases", "resnet50_v2:1"]).cases == (
        ("resnet50_v2", 1),)


def test_centred_agreement_sees_what_the_shared_top_class_hides() -> None:
    # Every input's raw top-1 is class 0 (a large shared offset); what depends on the input
    # puts its own top class at 1 or 2, and the other runtime swaps that for the last input.
    offset = np.array([100.0, 0.0, 0.0])
    reference = offset + np.array([[0, 1, 0], [0, 0, 1], [0, 1, 0], [0, 0, 1]], np.float32)
    other = reference.copy()
    other[3] = offset + np.array([0, 1, 0])
    assert executor.top1_agreement(reference, other) == (4, 4)
    assert executor.top1_agreement(reference, other, centred=True) == (3, 4)


def fake_result(extras: tuple[str, ...]) -> dict:
    times = {"ours": (0.012, 0.010), "bf16": (0.006, 0.005), "ort": (0.010, 0.009),
             **{peer: (0.004, 0.003) for peer in extras}}
    return {"infos": {"ours": {"flops": 3.6e9, "sgemm": 1.2e11}, "bf16": {}}, "calls": 7,
            "scale": 688.0,
            "bf16_error": 2e-3,
            "diff": {runtime: 1e-4 for runtime in times}, "times": times, "classes": 1,
            "steady": {runtime: best for runtime, (_, best) in times.items()},
            "agreement": {runtime: ((64, 64), (40, 64)) for runtime in times if runtime != "ort"}}


def test_a_row_gives_every_peer_its_column_ratio_and_agreement() -> None:
    extras = ("ov-f32", "ov-int8")
    header = executor.peer_header(extras)
    assert header.split()[-4:] == ["OpenVINO", "f32", "OpenVINO", "int8"]
    row, _, ratios, agreement = executor.peer_lines("resnet18_v1", 8, 0, fake_result(extras),
                                                 extras)
    assert row.split()[:2] == ["resnet18_v1", "8"]
    assert "1.20× [1.11×]" in row and row.endswith("MISSED")  # 12 ms ÷ 10 ms against ≤ 1.0
    assert "6.000 [5.000]" in row and " 0.50× " in row  # ours in bf16, and bf16 ÷ fp32
    # Without a measured OpenVINO bf16, the 50.5 ms for this case, marked.
    assert f"{6 / 50.5:.2f}×*" in row
    assert row.count("4.000 [3.000]") == 2
    assert ratios.startswith("    ours fp32 ÷ peer: OpenVINO f32 3.00×, OpenVINO int8 3.00×")
    assert "over 64 inputs (fp32 picks 1 class(es)" in agreement
    assert "OpenVINO int8 64/64 [40/64]" in agreement and "ours bf16 64/64" in agreement


def test_a_turn_counts_whole_and_its_steady_calls_alone() -> None:
    # Two turns: each one's first two calls ran after the pause (slow), the rest steady.
    turns = [[0.030, 0.012, 0.010, 0.010], [0.050, 0.011, 0.009, 0.011]]
    median, best = executor.turn_times(turns)
    assert best == 0.0155 and median == (0.0155 + 0.02025) / 2
    assert executor.steady_time(turns) == 0.010  # of 0.010, 0.010, 0.009, 0.011
    result = fake_result(("ov-f32", "ov-bf16", "int8", "ov-int8"))
    result["steady"].update({"ours": 0.009, "ort": 0.010, "ov-f32": 0.0075, "bf16": 0.004,
                             "ov-bf16": 0.005, "int8": 0.003, "ov-int8": 0.002})
    line = executor.steady_line(result)
    assert "ours 9.000, ours bf16 4.000, ONNX Runtime 10.000" in line
    assert "each turn's 7 calls from call 3 on" in line
    # fp32 against the faster of ORT and OpenVINO f32; each precision against its own peer.
    assert line.endswith("fp32 ÷ faster float peer 1.20×, bf16 ÷ OpenVINO bf16 0.80×, "
                         "int8 ÷ OpenVINO int8 1.50×")


def test_a_turn_runs_about_round_seconds_of_the_slowest_runtimes_steady_calls() -> None:
    # The last untimed turns: the slowest runtime's steady calls (after the first two, which
    # follow the pause) take 20 ms, so a turn of 0.15 s is 7-8 calls of it; a slow first call
    # does not shorten the turns, and fast runtimes never take them under the minimum.
    last = {"ours": [0.090, 0.030, 0.020, 0.020, 0.021], "ort": [0.040, 0.012, 0.010, 0.010]}
    assert executor.turn_calls(last) == round(executor.ROUND_SECONDS / 0.020)
    assert executor.turn_calls({"ours": [0.5, 0.4, 0.3, 0.3]}) == executor.MIN_TURN_CALLS


def test_bf16_against_openvino_uses_the_measured_peer_where_the_run_has_it() -> None:
    result = fake_result(("ov-bf16",))
    assert executor.against_openvino("resnet18_v1", 8, 0, result) == "1.50×"  # 6 ÷ 4 ms
    del result["times"]["ov-bf16"]
    assert executor.against_openvino("resnet18_v1", 8, 1, result) == "—"  # one thread
    assert executor.against_openvino("resnet18_v1", 4, 0, result) == "—"  # not in the issue


def test_without_peers_or_agreement_a_case_is_its_row_and_steady_line() -> None:
    result = fake_result(())
    del result["agreement"]
    result["times"]["ours"] = (0.030, 0.025)
    result["steady"]["ours"] = 0.025
    row, steady = executor.peer_lines("resnet50_v2", 1, 0, result, ())
    assert row.endswith("MISSED")  # ResNet-50 v2 is held to ≤ 1.0 as well
    assert steady.endswith("fp32 ÷ faster float peer 2.78×")  # 25 ÷ 9 ms, ORT its only peer
    row, _ = executor.peer_lines("mlp", 64, 1, {**result, "times": {
        **result["times"], "ours": (0.009, 0.008)}}, ())
    assert row.endswith("met") and " — " in row  # no OpenVINO time for the MLP


def test_one_thread_times_the_steps_by_the_cpu_they_took() -> None:
    # On one thread the step kinds are timed by the thread's CPU time, which a loaded
    # machine's other jobs do not add to: the clock given reaches the walk of the plan's
    # steps (each step's reading 0.5 apart here), and the line names the clock it read.
    graph, _ = conv_bn_relu()
    plan = Plan(graph, {"data": (1, 2, 5, 5)}, {"data": np.dtype(np.float32)})
    feed = {"data": np.ones((1, 2, 5, 5), np.float32)}
    readings = iter(np.arange(0.0, 4 * len(plan.steps), 0.5))
    kinds = executor.step_kinds(plan, feed, 2, lambda: float(next(readings)))
    assert sum(seconds for seconds, _ in kinds.values()) == 0.5 * len(plan.steps)
    assert kinds["conv 3x3"][1] == 2 * 4 * 25 * 2 * 9  # FLOPs: 2 · outputs · K
    result = fake_result(())
    result["infos"]["bf16"] = {"kinds": "conv 3x3 6.000 [550]", "kinds_clock": "CPU"}
    lines = executor.peer_lines("resnet18_v1", 1, 1, result, ())
    assert lines[-1] == "    bf16 by step kind, CPU ms per image [GFLOP/s]: conv 3x3 6.000 [550]"


def test_a_missing_peer_environment_is_named() -> None:
    problem = executor.peer_environment_problem("/nonexistent/python", ("ov-f32",))
    assert problem is not None and "/nonexistent/python" in problem


@pytest.fixture(scope="module")
def mlp_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = executor.prepare_network("mlp", tmp_path_factory.mktemp("peers"), 8)
    executor.write_case_input(folder, 2)
    return folder


def serve_once(python: str, runtime: str, folder: Path) -> dict:
    """One peer process through the benchmark's own protocol: built, two timed rounds, ended."""
    peer = executor.ExternalPeer(python, runtime, folder, 2, 1, agreement=True)
    info = peer.recv()
    for calls in (1, 3):
        peer.send(calls)
        seconds = peer.recv()
        assert len(seconds) == calls and all(0 < call < 60 for call in seconds)
    peer.send(None)
    peer.join()
    assert peer.process.returncode == 0
    return info


def fp32_reference(folder: Path, inputs: np.ndarray) -> np.ndarray:
    _, run, _ = executor.ort_runner(folder, 2, 1)
    return quantized_peers.outputs_in_batches(run, inputs, 2)


def test_ort_int8_peer_quantises_and_answers_over_its_pipe(mlp_folder: Path) -> None:
    # ONNX Runtime is a dev dependency, so this peer runs in the project's own Python here.
    info = serve_once(sys.executable, "ort-int8", mlp_folder)
    assert "int8" in info["precision"] and info["threads"] == "intra-op 1"
    assert (mlp_folder / "model-ort-int8.onnx").exists()
    inputs = np.load(mlp_folder / "agreement.npy")
    quantized = np.load(mlp_folder / "ort-int8-b2-agreement.npy")
    reference = fp32_reference(mlp_folder, inputs)
    assert quantized.shape == reference.shape == (8, 2)
    # int8 is near fp32, not equal to it.
    error = np.abs(quantized - reference).max() / np.abs(reference).max()
    assert 0 < error < 0.1


def peer_python() -> str:
    python = executor.peer_python(None)
    if executor.peer_environment_problem(python, ("ov-f32",)):
        pytest.skip(f"no OpenVINO peer environment ({executor.PEER_PYTHON_VARIABLE} or "
                    f"{executor.DEFAULT_PEER_PYTHON}; bench/requirements-peers.txt)")
    return python


@pytest.mark.parametrize(("runtime", "tolerance"), [("ov-f32", 1e-4), ("ov-bf16", 0.05),
                                                    ("ov-int8", 0.1)])
def test_openvino_peer_reports_its_precision_and_matches_fp32(
        mlp_folder: Path, runtime: str, tolerance: float) -> None:
    info = serve_once(peer_python(), runtime, mlp_folder)
    precision = runtime.removeprefix("ov-")
    if precision == "bf16" and not host_features.bf16_dot_product():
        precision = "f32"  # OpenVINO's choice, and its report, on a CPU without bf16 products
    if precision != "int8":
        assert info["precision"].startswith(f"hint {precision};")
        assert f"at {precision} ×" in info["precision"]
    else:
        assert "i8 ×" in info["precision"] and (mlp_folder / "model-ov-int8.xml").exists()
    inputs = np.load(mlp_folder / "agreement.npy")
    outputs = np.load(mlp_folder / f"{runtime}-b2-agreement.npy")
    reference = fp32_reference(mlp_folder, inputs)
    assert np.abs(outputs - reference).max() <= tolerance * np.abs(reference).max()


def test_the_protocol_survives_a_library_writing_to_stdout(tmp_path: Path) -> None:
    # What a library prints (NNCF's progress bars) must not reach the answers' pipe.
    script = tmp_path / "noisy.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(quantized_peers.__file__).parent)!r})\n"
        "import quantized_peers\n"
        "def noisy(*args):\n"
        "    print('progress 100%')\n"
        "    os.write(1, b'native progress\\n')\n"
        "    return (lambda x: x * 2), {'precision': 'x2'}\n"
        "quantized_peers.build = noisy\n"
        "quantized_peers.main()\n")
    folder = tmp_path / "net"
    folder.mkdir()
    np.save(folder / "data-b1.npy", np.ones((1, 3), np.float32))
    answers = subprocess.run([sys.executable, str(script), "ov-f32", str(folder), "--batch", "1"],
                             input="2\n\n", capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": ""})
    assert answers.returncode == 0, answers.stderr
    first, second = answers.stdout.splitlines()
    assert '"precision": "x2"' in first and len(json.loads(second)) == 2
    assert "progress 100%" in answers.stderr and "native progress" in answers.stderr
    np.testing.assert_array_equal(np.load(folder / "ov-f32-b1-output.npy"), [[2, 2, 2]])


def test_layer_turns_run_the_calls_each_turn_asks_and_tabulate_them_all(
        tmp_path: Path) -> None:
    """``--layer-turns``: ready once warm, each count run and answered, then at the end of
    input one table over every turn's calls, each layer's median in OpenVINO's order."""
    script = tmp_path / "turns.py"
    script.write_text(
        "import datetime, sys, types\n"
        f"sys.path.insert(0, {str(Path(quantized_peers.__file__).parent)!r})\n"
        "import quantized_peers\n"
        "calls = []\n"
        "def layer(name, ms):\n"
        "    return types.SimpleNamespace(node_name=name, node_type='Convolution',\n"
        "        exec_type='jit', real_time=datetime.timedelta(milliseconds=ms))\n"
        "class Request:\n"
        "    def infer(self, inputs):\n"
        "        calls.append(1)\n"
        "        self.profiling_info = [layer('b', len(calls)), layer('a', 1.0)]\n"
        "quantized_peers.profiled_request = lambda *args: (Request(), None)\n"
        "quantized_peers.main()\n")
    answers = subprocess.run([sys.executable, str(script), "ov-int8", str(tmp_path),
                              "--batch", "1", "--layer-turns"], input="2\n3\n",
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": ""})
    assert answers.returncode == 0, answers.stderr
    lines = answers.stdout.splitlines()
    assert lines[:3] == [quantized_peers.TURNS_READY, quantized_peers.TURN_DONE,
                         quantized_peers.TURN_DONE]
    assert "in turns with ours" in lines[3] and "median of 5 calls" in lines[3]
    # layer b took 1..5 ms over the five calls: median 3; a, 1 ms each; in that order
    assert [line.split()[0] for line in lines[4:]] == ["3.000", "1.000"]
    assert lines[4].split()[2] == "b"


def test_process_clock_counts_the_cpu_a_call_spends_not_its_sleep() -> None:
    # A call that sleeps 50 ms and spins 20 ms: the wall clock reads both, the process's CPU
    # time only the spin.
    def call() -> None:
        time.sleep(0.05)
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass

    (wall,) = quantized_peers.timed_calls(call, 1, quantized_peers.CLOCKS["wall"])
    (cpu,) = quantized_peers.timed_calls(call, 1, quantized_peers.CLOCKS["process"])
    assert wall >= 0.07 and 0.02 <= cpu < 0.05


def test_process_clock_needs_one_thread(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert executor.parser().parse_args([]).clock == "wall"
    monkeypatch.setattr(sys, "argv", ["executor.py", "--clock", "process", "--threads", "2"])
    with pytest.raises(SystemExit):
        executor.main()
    assert "--threads 1" in capsys.readouterr().err


def test_the_peer_protocol_times_calls_by_the_clock_asked_for(tmp_path: Path) -> None:
    # A peer whose call sleeps answers near-zero seconds with --clock process.
    script = tmp_path / "sleepy.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(quantized_peers.__file__).parent)!r})\n"
        "import quantized_peers\n"
        "def sleepy(*args):\n"
        "    return (lambda x: time.sleep(0.05) or x), {'precision': 'same'}\n"
        "quantized_peers.build = sleepy\n"
        "quantized_peers.main()\n")
    folder = tmp_path / "net"
    folder.mkdir()
    np.save(folder / "data-b1.npy", np.ones((1, 3), np.float32))
    seconds = {}
    for clock in ("wall", "process"):
        answers = subprocess.run(
            [sys.executable, str(script), "ov-f32", str(folder), "--batch", "1", "--clock",
             clock], input="2\n\n", capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": ""})
        assert answers.returncode == 0, answers.stderr
        seconds[clock] = json.loads(answers.stdout.splitlines()[1])
    assert min(seconds["wall"]) >= 0.045 and max(seconds["process"]) < 0.02


def test_armed_option_arms_every_run_of_the_plan_the_model_runs() -> None:
    # `--armed` swaps the plan's measured choice for one that always arms: the plan `infer`
    # runs, whose own choice tries one thread among its first runs (each way in turn).
    import engine

    graph, constants = conv_bn_relu()
    model = engine.load_model(graph, constants)
    feed = {"data": np.ones((1, 2, 5, 5), np.float32)}
    measured, answers = model.plan_for(feed)._spin_choice, []
    for _ in range(8):
        answers.append(measured.armed())
        measured.record(answers[-1], 0.001)
    assert not all(answers)
    executor.force_armed(model, feed)
    for _ in range(40):
        model.infer(feed)
        assert model.plan_for(feed)._spin_choice.armed()
    assert executor.parser().parse_args(["--armed"]).armed


def test_our_idle_workers_are_off_the_cpu_before_the_next_runtimes_turn() -> None:
    """After a run our pool's workers spin, then doze (polling, about a third of a vCPU on a
    VM); both end within the pause before another runtime's turn, so that no runtime's turn
    pays for our idle workers (beside a 0.5 s doze the others took 1.5-2.1x as long on
    MobileNet v2)."""
    assert spin_pool.GRACE_SECONDS + spin_pool.DOZE_SECONDS < executor.SETTLE_SECONDS


def test_the_cpu_in_each_turn_is_read_per_process_and_said_per_runtime() -> None:
    # This process's own CPU time, as /proc gives it, grows by the work it does; a process that
    # is gone reads 0; the line names each runtime's own and the others' cores.
    class Worker:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    workers = {"ours": Worker(os.getpid()), "ort": Worker(2**22 + 1)}
    before = executor.processes_cpu(workers)
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    after = executor.processes_cpu(workers)
    assert after["ours"] - before["ours"] >= 0.05 and after["ort"] == before["ort"] == 0.0
    result = fake_result(())
    result["turn_cpu"] = {"ours": (1.92, 0.04), "ort": (1.85, 0.61)}
    lines = executor.peer_lines("resnet18_v1", 1, 0, result, ())
    assert lines[2] == ("    CPU in each runtime's turns, cores (its own / the other "
                        "processes'): ours 1.92 / 0.04, ONNX Runtime 1.85 / 0.61")
