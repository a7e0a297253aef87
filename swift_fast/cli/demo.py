"""`swift-fast demo`: Best-of-N with the embedded model and head; `swift-fast demo build` rebuilds them."""

from __future__ import annotations

import os


def add_parser(sub, name, help_):
    p = sub.add_parser(
        name,
        help=help_,
        description=help_ + ". Samples N candidates per held-out problem through the vLLM plugin (CPU), "
        "prints the Best-of-N table with 95% confidence intervals, and writes a plot and an HTML page of "
        "candidates with their SWIFT token scores.",
    )
    p.add_argument("action", nargs="?", choices=("run", "build", "ablations"), default="run",
                   help="run (default): the demo; build: retrain the model and head from nothing (CPU); "
                   "ablations: retrain head variants on the build's rollouts and score a run's candidates")
    p.add_argument("--out", default=None,
                   help="run: output folder (default demo_out); build: artefact folder (default: the shipped one)")
    p.add_argument("--assets", default=None, help="artefact folder to run on (default: the shipped one)")
    p.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto",
                   help="generation engine: the vLLM plugin (default when vLLM imports) or transformers")
    p.add_argument("--limit", type=int, default=None, help="run on the first N held-out problems only")
    p.add_argument("--split", choices=("test", "train"), default="test",
                   help="run: the held-out problems (default), or the training problems (to choose pruning "
                        "settings on problems the held-out results are not measured on)")
    p.add_argument("--no-prune", action="store_true",
                   help="run: no pruned run beside full Best-of-N (the replayed sweep of settings still runs)")
    p.add_argument("--n", type=int, default=16, help="candidates per problem (default 16)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--show", type=int, default=4, help="problems shown in the HTML page")
    p.add_argument("--work", default="demo_build", help="build: folder for intermediates (model, rollouts)")
    p.add_argument("--reuse", action="store_true", help="build: keep the model and rollouts already in --work")
    p.add_argument("--rollouts", default="demo_out/rollouts.jsonl",
                   help="ablations: the run whose candidates are scored")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--verbose", action="store_true",
                   help="run: keep vLLM's INFO logs (default: warnings only, unless VLLM_LOGGING_LEVEL is set)")
    return p


def run(args) -> int:
    from ..demo import assets as A

    if args.action in ("build", "ablations"):
        from ..training import LabelBalanceError

        try:
            if args.action == "build":
                from ..demo.build import build

                build(out=args.out or A.ASSETS_DIR, work=args.work, progress=not args.no_progress, reuse=args.reuse)
            else:
                from ..demo.ablations import run_ablations

                run_ablations(args.rollouts, work=args.work,
                              out=os.path.join(args.out or "demo_out", "ablations.json"),
                              progress=not args.no_progress)
        except LabelBalanceError as e:
            raise SystemExit(f"swift-fast demo {args.action}: {e}") from None
        return 0
    from ..demo.backend import quiet_vllm_logs
    from ..demo.run import run_demo

    if not args.verbose:
        # this command's own process and the engine it spawns: a library call never does this
        quiet_vllm_logs()
    try:
        from ..demo.run import DEMO_PRUNE

        run_demo(out_dir=args.out or "demo_out", root=args.assets or A.ASSETS_DIR, backend=args.backend,
                 limit=args.limit, n=args.n, seed=args.seed, show=args.show, progress=not args.no_progress,
                 prune=None if args.no_prune else DEMO_PRUNE, split=f"{args.split}.jsonl")
    except A.AssetError as e:
        raise SystemExit(f"swift-fast demo: {e}") from None
    return 0
