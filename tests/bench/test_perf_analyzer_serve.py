"""How `bench/perf_analyzer_serve.py` finds Triton's environment (the peer itself needs that
environment and perf_analyzer, so its runs are the benchmark's, not the tests')."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import perf_analyzer_serve  # noqa: E402


def test_the_option_wins_then_the_variable_then_the_default_folder_where_it_exists(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(perf_analyzer_serve.TRITON_PYTHON_VARIABLE, "/from/variable")
    assert perf_analyzer_serve.triton_python("/given") == "/given"
    assert perf_analyzer_serve.triton_python(None) == "/from/variable"
    monkeypatch.delenv(perf_analyzer_serve.TRITON_PYTHON_VARIABLE)
    absent = tmp_path / "triton-peer" / "bin" / "python"
    monkeypatch.setattr(perf_analyzer_serve, "DEFAULT_TRITON_PYTHON", absent)
    assert perf_analyzer_serve.triton_python(None) is None  # no Triton columns
    absent.parent.mkdir(parents=True)
    absent.touch()
    assert perf_analyzer_serve.triton_python(None) == str(absent)


def test_a_peer_that_ends_before_ready_is_reported_with_its_log(tmp_path: Path) -> None:
    # The uploaded ResNet-18's files exported as the benchmark exports them; a "Python" that
    # prints a line of log and exits stands in for a Triton that fails to load the model.
    perf_analyzer_serve.serve.build_models(tmp_path, 32)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'E1130 model_lifecycle: failed to load resnet18'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError) as failed:
        perf_analyzer_serve.start_triton(str(fake), tmp_path, 32)
    assert "exit status 3" in str(failed.value)
    assert "failed to load resnet18" in str(failed.value)
    assert (tmp_path / "resnet18.onnx").stat().st_size > 1_000_000  # ResNet-18's weights


def test_a_silent_peer_is_stopped_and_reported_after_the_startup_limit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    perf_analyzer_serve.serve.build_models(tmp_path, 32)
    monkeypatch.setattr(perf_analyzer_serve, "STARTUP_SECONDS", 1)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'I1203 server: loading'\nexec sleep 600\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="nothing of being ready within 1 s") as failed:
        perf_analyzer_serve.start_triton(str(fake), tmp_path, 32)
    assert "loading" in str(failed.value)


def test_a_ready_peer_logs_to_a_file_and_never_stalls_on_a_full_pipe(tmp_path: Path) -> None:
    # A "Python" that says ready, then writes 1 MB of log (a pipe holds 64 KB) and leaves a
    # mark, then waits for its standard input to close, as the peer does.
    perf_analyzer_serve.serve.build_models(tmp_path, 32)
    mark = tmp_path / "logged"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho ready\n"
                    "head -c 1048576 /dev/zero | tr '\\0' 'w'\n"
                    f"touch {mark}\ncat > /dev/null\n")
    fake.chmod(0o755)
    process, addresses = perf_analyzer_serve.start_triton(str(fake), tmp_path, 32)
    assert set(addresses) == {"http", "grpc"}
    perf_analyzer_serve.stop_triton(process)  # closes its input: it ends on its own
    assert process.returncode == 0 and mark.exists()
    assert (tmp_path / "triton.log").stat().st_size > 1_048_576


def test_an_unstable_measurement_is_run_once_more_then_reported(tmp_path: Path) -> None:
    # A perf_analyzer stand-in that gives up on stability the first time it runs and writes
    # its report the second; another that never settles fails with perf_analyzer's words.
    calls = tmp_path / "calls"
    settles = tmp_path / "settles"
    settles.write_text(
        "#!/bin/sh\necho run >> " + str(calls) + "\n"
        "if [ $(wc -l < " + str(calls) + ") -lt 2 ]; then\n"
        "  echo 'Failed to obtain stable measurement.'; exit 1\nfi\n"
        "while [ $# -gt 1 ]; do [ \"$1\" = -f ] && out=$2; shift; done\n"
        "printf 'Inferences/Second,p50 latency,p99 latency\\n40.5,90000,120000\\n' > $out\n")
    settles.chmod(0o755)
    found = perf_analyzer_serve.measure([str(settles)], "grpc", "127.0.0.1:1", 4, 1.0,
                                        tmp_path / "report.csv")
    assert found == {"throughput": 40.5, "p50_ms": 90.0, "p99_ms": 120.0}
    assert calls.read_text().count("run") == 2
    never = tmp_path / "never"
    never.write_text("#!/bin/sh\necho 'Failed to obtain stable measurement.'\nexit 1\n")
    never.chmod(0o755)
    with pytest.raises(RuntimeError, match="stable measurement"):
        perf_analyzer_serve.measure([str(never)], "http", "127.0.0.1:1", 4, 1.0,
                                    tmp_path / "other.csv")
