"""A job's own output stays on the terminal while vLLM's (native code, engine processes, loading
bars drawn from this process) goes to a log file (`swift_fast.support.engine_logs`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from swift_fast.support.engine_logs import engine_output_to, engine_starting


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    # a fresh process whose stdout and stderr are real descriptors 1 and 2, as a terminal's are
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_engine_output_goes_to_the_log_and_the_jobs_output_stays(tmp_path):
    r = _run("""
        import os, subprocess, sys
        from swift_fast.support.engine_logs import engine_output_to, engine_starting
        print("before")
        with engine_output_to("run/engine.log"):
            print("ours, stdout")
            print("ours, stderr", file=sys.stderr)
            os.write(1, b"native write to fd 1\\n")
            os.write(2, b"native write to fd 2\\n")
            child = "import sys; print('child out'); print('child err', file=sys.stderr)"
            subprocess.run([sys.executable, "-c", child])
            with engine_starting():
                print("a loading bar drawn from this process", file=sys.stderr)
            print("ours again")
        os.write(1, b"native after\\n")
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["before", "ours, stdout", "ours again", "native after"]
    assert r.stderr.splitlines() == ["ours, stderr"]
    log = (tmp_path / "run" / "engine.log").read_text().splitlines()
    assert sorted(log) == sorted(["native write to fd 1", "native write to fd 2", "child out", "child err",
                                  "a loading bar drawn from this process"])


def test_a_replaced_stream_is_left_alone_and_engine_starting_is_inert_outside(tmp_path, capsys):
    with engine_starting():  # no block open: nothing changes
        print("plain")
    with engine_output_to(tmp_path / "e.log"):
        print("captured by the test's stream")
        os.write(1, b"to the log\n")
    out = capsys.readouterr().out
    assert "plain" in out and "captured by the test's stream" in out and "to the log" not in out
    assert (tmp_path / "e.log").read_text() == "to the log\n"


def test_startup_output_is_held_until_released(tmp_path):
    r = _run("""
        import os, sys
        from swift_fast.support.engine_logs import StartupOutput
        out = StartupOutput("start.log")
        print("vLLM start-up line")
        os.write(2, b"native warning\\n" + b"Loading 0%\\rLoading 100%\\n")
        print("our line", file=out.console)
        out.release()
        out.release()
        print("after release")
        print(out.tail(2), file=out.console)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["after release"]
    assert r.stderr.splitlines() == ["our line", "native warning", "Loading 100%"]
    assert (tmp_path / "start.log").read_text().startswith("vLLM start-up line\n")
