"""Progress phases: a bar on a terminal, one line elsewhere; vLLM's `use_tqdm` hook counts candidates."""

from __future__ import annotations

import io

from swift_fast.progress import phase, vllm_progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_phase_off_a_terminal_prints_one_line_with_its_figures():
    out = io.StringIO()
    bar = phase("generate (vllm)", total=48, unit="candidate", file=out)
    for _ in range(3):
        bar.update(16)
    bar.set_postfix(tokens="1,024")
    assert out.getvalue() == ""  # nothing while it runs: no carriage-return redraws in a log
    bar.close()
    bar.close()
    line = out.getvalue()
    assert line.count("\n") == 1 and "\r" not in line
    assert line.startswith("generate (vllm): 48/48 candidates in ") and line.rstrip().endswith("tokens 1,024")


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
