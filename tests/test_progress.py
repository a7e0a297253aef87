"""Progress phases: a bar on a terminal, one line elsewhere; vLLM's `use_tqdm` hook counts candidates."""

from __future__ import annotations

import io

from swift_fast.support.progress import phase, vllm_progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_phase_off_a_terminal_prints_whole_lines_at_each_tenth_and_one_summary():
    out = io.StringIO()
    bar = phase("generate (vllm)", total=48, unit="candidate", file=out)
    bar.update(2)
    assert out.getvalue() == ""  # under a tenth, and well within the heartbeat: nothing yet
    bar.update(14)  # 16 of 48: the third tenth
    bar.update(16)  # 32 of 48: the sixth
    running = out.getvalue().splitlines()
    assert len(running) == 2 and "\r" not in out.getvalue()
    assert running[0].startswith("generate (vllm): 16/48 candidates (33%) after ")
    assert "candidate/s" in running[0] and running[0].endswith(" left")
    assert running[1].startswith("generate (vllm): 32/48 candidates (67%)")
    bar.update(16)
    bar.set_postfix(tokens="1,024")
    bar.close()
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # the last tenth is the closing line's, and a second close prints nothing
    assert lines[2].startswith("generate (vllm): 48/48 candidates in ") and lines[2].endswith("tokens 1,024")


def test_a_phase_whose_count_does_not_move_still_prints_a_line_every_heartbeat():
    import time

    out = io.StringIO()
    bar = phase("generate (vllm)", total=100, unit="candidate", file=out, heartbeat=0.2)
    time.sleep(0.5)
    bar.update(1)
    time.sleep(0.3)
    bar.close()
    lines = out.getvalue().splitlines()
    beats = lines[:-1]
    assert len(beats) >= 2, lines
    assert beats[0].startswith("generate (vllm): 0/100 candidates (0%) after ") and beats[0].endswith("no estimate yet")
    assert any(b.startswith("generate (vllm): 1/100 candidates (1%)") and b.endswith(" left") for b in beats), beats
    n = len(lines)
    time.sleep(0.5)
    assert len(out.getvalue().splitlines()) == n  # closed: the timer stopped


def test_a_phase_without_tenths_prints_only_heartbeats_and_its_summary():
    out = io.StringIO()
    bar = phase("epoch 1", total=10, unit="batch", file=out, tenths=False)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert len(out.getvalue().splitlines()) == 1


def test_a_phase_on_a_terminal_is_a_bar_and_a_disabled_one_prints_nothing():
    tty = _Tty()
    bar = phase("grade", total=2, unit="answer", file=tty)
    bar.update(2)
    bar.close()
    assert "grade" in tty.getvalue() and "2/2" in tty.getvalue()
    quiet = io.StringIO()
    bar = phase("grade", total=2, enabled=False, file=quiet)
    bar.update(2)
    bar.close()
    assert quiet.getvalue() == ""


def test_vllm_progress_counts_what_vllm_reports_and_drops_its_rendering_bar():
    """The calls vLLM 0.32's LLM._run_engine and maybe_tqdm make on a `use_tqdm` factory."""
    out = io.StringIO()
    bar = phase("generate", total=8, unit="candidate", file=out)
    factory = vllm_progress(bar)
    prompts = [[1, 2], [3]]
    assert factory(prompts, desc="Rendering prompts") is prompts
    pbar = factory(total=8, desc="Processed prompts", dynamic_ncols=True, postfix="est. speed")
    pbar.postfix = "est. speed input: 1 toks/s"
    assert pbar.format_dict["elapsed"] > 0
    pbar.update(4)
    pbar.update(4)
    assert pbar.n == 8
    pbar.refresh()
    pbar.close()
    bar.close()
    assert "generate: 8/8 candidates" in out.getvalue()


def test_a_rate_keeps_three_significant_digits_however_slow_the_work():
    from swift_fast.support.progress import _rate

    assert _rate(23, 170.7, "fit") == ", 0.135 fit/s"  # 23 / 170.7 = 0.13474...
    assert _rate(1, 5000.0, "fit") == ", 0.0002 fit/s"
    assert _rate(5, 2.0, "fit") == ", 2.50 fit/s"
    assert _rate(12800, 870.8, "candidate") == ", 14.7 candidate/s"
    assert _rate(3200, 11.4, "candidate") == ", 281 candidate/s"
    assert _rate(0, 3.0, "fit") == "" and _rate(4, 0.0, "fit") == ""  # nothing done, or no time: no rate
