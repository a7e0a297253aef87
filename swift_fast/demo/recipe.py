"""Every setting and seed of the demo artefacts, in one place: ``swift-fast demo build`` reads
this, and the provenance file records it.

``DEFAULT`` builds the shipped demo (``task.py``: the solver forgets the last term); ``LAG``
builds the second task (``task_lag.py``: the solver reads the first term twice and stays one term
behind). ``RECIPES`` names both."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .model import ModelConfig, TrainConfig
from .task import TaskConfig
from .task_lag import LagConfig
from .tokenizer import SYSTEM_PROMPT


@dataclass(frozen=True)
class HeadRecipe:
    loss: str = "dpo"
    layers: str = "all"
    alignment: str = "predicting"
    feature: str = "hidden"
    gate: bool = True
    lr: float = 1e-3
    weight_decay: float = 1e-5
    batch_size: int = 16
    max_epochs: int = 40
    patience: int = 3
    seed: int = 0


@dataclass(frozen=True)
class Recipe:
    #: forget_rates: the sloppy solver drops the last term of 3/4/5-term sums this often, so majority
    #: vote is right on 3 terms, a coin flip on 4 and wrong on 5
    task: TaskConfig = TaskConfig(min_terms=3, max_terms=5, max_digits=2, forget_rates=(0.2, 0.45, 0.7))
    model: ModelConfig = ModelConfig(hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=512)
    #: 2 threads: ~0.28 s a step on an idle 2-core machine (~12 min); the thread count is part of
    #: what makes the weights bit-identical between builds
    train: TrainConfig = TrainConfig(
        steps=2500, batch_size=64, lr=3e-3, warmup=100, weight_decay=0.01, seed=0, threads=2
    )
    test_problems: int = 200
    test_seed: int = 1
    train_problems: int = 400
    train_seed: int = 2
    #: candidates per training problem for the head's rollouts, and their sampling
    rollouts_n: int = 16
    rollouts_seed: int = 2
    temperature: float = 1.0
    top_p: float = 0.9
    max_new_tokens: int = 160
    head: HeadRecipe = field(default_factory=HeadRecipe)
    # the system prompt of the demo's generation prompts (none); SAR's question-removed prompt is
    # the same chat with the user turn emptied. Kept under this name: the shipped provenance has it.
    sar_system_prompt: str | None = SYSTEM_PROMPT

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT = Recipe()



#: The second task (``task_lag.py``): a solver that reads the first term twice and stays one term
#: behind. The flaw shows at the third response token and the candidate goes on for 4 to 7 more
#: steps with the correct step count; the lag rate grows with the number of terms (majority vote is
#: right on 5-6 terms and wrong on 7-8), and neither length nor confidence carries the flaw. Same
#: model family and head recipe as ``DEFAULT``; one thread, so that a build on a shared 2-core
#: machine reproduces the evaluated weights (~15 min on a busy machine, 0.6 s a step).
LAG = Recipe(
    task=LagConfig(min_terms=5, max_terms=8, lag_rates=(0.2, 0.4, 0.6, 0.8)),
    model=ModelConfig(hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=512),
    train=TrainConfig(steps=1500, batch_size=64, lr=3e-3, warmup=100, weight_decay=0.01, seed=0, threads=1),
)

RECIPES = {"forget": DEFAULT, "lag": LAG}
