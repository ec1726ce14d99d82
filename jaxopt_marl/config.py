"""One training run's configuration (:class:`RunConfig`) and its presets, each hyper-parameter declared once.

Where a value comes from (paper = "Training Small LLMs as Spatial Multi-Agent Policies"):

==================  ==============================  ===================================================
hyper-parameter     paper preset                    source
==================  ==============================  ===================================================
LoRA rank           32 Cleanup / Harvest, 16 OC      §6.1 ("LoRA rank 32" / "LoRA rank 16")
LoRA alpha          2 x rank                        ours (not stated): :data:`lora.config.ALPHA_PER_RANK`
learning rate       5e-5 Cleanup / Harvest, 2e-5 OC  §6.1
K rollouts          4 Cleanup / Harvest, 6 OC        §6.1
temperature         0.7 Cleanup / Harvest, 0.9 OC    §6.1 ("sampling temperature")
KL weight beta      0.05                            §6.1 for Overcooked; ours (same value) for the others
PPO clip, epochs    0.2, 2                          §6.1 ("PPO clip 0.2, two inner epochs")
gradient clip       1.0                             §6.1
episode steps       150 Cleanup, 400 Harvest / OC    §6.1
MIN_SUPPORT         5                               §5.1 Stage 3 ("at least five"; :data:`guards.MIN_SUPPORT`)
burn-in episodes    2000 solo + 2000 joint           §5.1 (the AA burn-in)
evaluation          20 episodes, seeds 10000..       §6.1 ("20 episodes with seeds disjoint from training")
rounds              100                             ours (not stated)
solo-test seeds     5 OC, 3 Cleanup / Harvest        §6.4 for Overcooked; ours (audit.MIN_SOLO_SEEDS)
==================  ==============================  ===================================================

The per-game values live in :data:`PAPER` (also read by :meth:`jaxopt_marl.magrpo.MAGRPOConfig.paper`); the
update's remaining ones (clip, epochs, gradient clip, Adam) are :class:`jaxopt_marl.magrpo.MAGRPOConfig`'s
defaults, each with its source there.

One field per hyper-parameter: the update (:class:`~jaxopt_marl.magrpo.MAGRPOConfig`, :attr:`RunConfig.magrpo`)
and the policy (:meth:`RunConfig.policy_config`) read the sampling temperature from ``magrpo.temperature``; the
LoRA adapters are :attr:`RunConfig.lora` (a :class:`lora.LoRAConfig`; rank and alpha declared once). Every value
is validated here: a bad one is a ``ValueError`` naming the field and the value (the command line turns it into
its one-line ``error: ...``, :mod:`experiments.cli`).

Presets (:class:`RunConfig` constructors):

- ``paper`` -- §6.1, the table above; full two-line responses sampled.
- ``cpu`` -- the default without an accelerator: the same pipeline on a reduced budget meant to finish in
  about 30 minutes on 2 CPU cores (measured phases in the README; episodes of 30 steps for Cleanup, 20 for
  Harvest, 80 for Overcooked; K 2, 2 rounds, 1 PPO epoch, ``choice_only`` scoring, 2 evaluation episodes,
  100 + 100 burn-in episodes, no update in rounds without return spread, a 1-seed solo test). Says so in the
  console and in the report.
- ``smoke`` -- a few minutes, to test the pipeline end to end (every stage and file, resume, report), not the
  method: 12-step episodes, 2 rounds, LoRA rank 2, lr 1e-2. Runs the 2-layer random model (``tiny-random``)
  unless ``model`` is given; with a real model it warns that the budget gives meaningless training numbers
  (:func:`smoke_warning`).
"""

from __future__ import annotations

import dataclasses
import math

from jaxopt_marl.guards import MIN_SUPPORT
from jaxopt_marl.magrpo import MAGRPOConfig
from lora.config import LoRAConfig

GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")
PRESETS = ("paper", "cpu", "smoke")
MODES = ("sample", "choice_only")
# The action interfaces (paper Table 2; jaxopt_marl.interfaces, which imports JAX arrays: the names live here so
# that the checks made before jax.distributed starts import no backend). menu = the method.
INTERFACES = ("menu", "native", "compound_json")
# Longest sampled response of a compound_json run ({"action": "go_to_orchard"} is 9 SmolLM2 tokens,
# {"action": "clean_dirt", "target": [14, 5]} 16; twice that leaves room for a preamble). Ours.
COMPOUND_MAX_NEW_TOKENS = 32
EVAL_SEED0 = 10000  # paper §6.1: 20 evaluation episodes, seeds disjoint from training
PAPER_EVAL_EPISODES = 20  # §6.1
PAPER_ROUNDS = 100  # not stated in the paper: our choice
PAPER_BURNIN_EPISODES = 2000  # §5.1: the AA burn-in is 2,000 solo + 2,000 joint episodes
TINY_RANDOM = "tiny-random"  # --model of the 2-layer random decoder on SmolLM2's tokenizer (tests, smoke preset)
DEFAULT_MODEL = "default"  # --model default: the embedded SmolLM2-135M-Instruct GGUF (RunConfig.model None)
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (GGUF)"
EVAL_CHECKPOINTS = ("best", "final")  # best: paper §6.1 checkpoint rule; final: the last round's adapters
CHUNKINGS = ("auto", "single")  # the compiled rollout's model calls per wave (RunConfig.chunking)
# The menu's letters (RunConfig.letters): "shuffled" per decision with an episode-seeded key (paper §5.1, the method)
# or "fixed" in the menu's construction order (a diagnostic, not the paper's: a letter then keeps its place).
LETTER_ORDERS = ("shuffled", "fixed")
CHECKPOINT_RULE = "highest training-time team return (paper §6.1)"
NUM_AGENTS = {"cleanup": 7, "harvest": 7, "overcooked_aa": 2, "overcooked_fc": 2}
# Per-game paper values (§6.1; "Cleanup and Commons Harvest" share one set, Overcooked-AI the other).
PAPER = {
    "cleanup": dict(lora_rank=32, learning_rate=5e-5, num_rollouts=4, temperature=0.7, episode_steps=150),
    "harvest": dict(lora_rank=32, learning_rate=5e-5, num_rollouts=4, temperature=0.7, episode_steps=400),
    "overcooked_aa": dict(lora_rank=16, learning_rate=2e-5, num_rollouts=6, temperature=0.9, episode_steps=400),
    "overcooked_fc": dict(lora_rank=16, learning_rate=2e-5, num_rollouts=6, temperature=0.9, episode_steps=400),
}
# The update's per-game paper values (the MAGRPOConfig fields of PAPER).
PAPER_UPDATE_KEYS = ("learning_rate", "num_rollouts", "temperature")
# Solo-test seeds, paper preset (§6.4 gives none for Cleanup and Harvest: 3 = audit.MIN_SOLO_SEEDS, the fewest
# that can give a verdict).
SOLO_PAPER = {"overcooked_aa": 5, "overcooked_fc": 5, "cleanup": 3, "harvest": 3}
# Decisions per forward/backward chunk in the update (memory only): the runs' MAGRPOConfig.micro_batch, where
# MAGRPOConfig's own default is 0 (the whole minibatch at once).
MICRO_BATCH = 8
MAGRPO_FIELDS = frozenset(f.name for f in dataclasses.fields(MAGRPOConfig))
# config.json spells RunConfig.lora's fields with this prefix (lora_rank, lora_alpha, lora_dropout, lora_targets);
# num_adapters follows from the game and magrpo.shared_adapter and is not a key of its own.
LORA_PREFIX = "lora_"
LORA_FLAT = frozenset(LORA_PREFIX + f.name for f in dataclasses.fields(LoRAConfig) if f.name != "num_adapters")
# config.json keys a --resume may change: rounds (extend a run, or stop it early: the trainer runs rounds
# state.round .. rounds - 1, none when it has done more) and the evaluation-only settings (evaluation and solo
# test run afresh after the last round of every invocation, and config.json is rewritten with the new values).
# Everything else shapes the training trajectory (or the burn-in and guards that a resume reuses) and must match.
#: The most steps --format-warmup takes (ours: the CPU probe's format is learnt in 15-30; a bound that turns a typo
#: of a few extra zeros into an error instead of a run that never ends).
MAX_FORMAT_WARMUP = 10_000
RESUME_MAY_DIFFER = frozenset({"rounds", "eval_episodes", "eval_base", "eval_checkpoint", "solo_episodes"})


def check_interface(name: str) -> None:
    """ValueError naming ``name`` and the valid interfaces unless it is one of :data:`INTERFACES`."""
    if name not in INTERFACES:
        raise ValueError(f"unknown interface {name!r}; valid interfaces: {', '.join(INTERFACES)}")


def interface_overrides(kw: dict) -> dict:
    """A run's config overrides ``kw`` (``RunConfig`` field -> value) with what ``compound_json`` needs and ``kw``
    leaves open: ``mode="sample"`` (the cpu preset scores letters only) and ``max_new_tokens`` =
    :data:`COMPOUND_MAX_NEW_TOKENS`. Other interfaces: ``kw`` unchanged."""
    if kw.get("interface") != INTERFACES[2]:
        return kw
    return {"mode": "sample", "max_new_tokens": COMPOUND_MAX_NEW_TOKENS, **kw}


def check_game(game: str) -> None:
    """ValueError unless ``game`` is one of :data:`GAMES`."""
    if game not in GAMES:
        raise ValueError(f"unknown game {game!r}; valid games: {', '.join(GAMES)}")


def num_agents(game: str) -> int:
    """Agents of ``game`` (7 in the Melting Pot games, 2 in Overcooked)."""
    check_game(game)
    return NUM_AGENTS[game]


def _require(name: str, value, ok: bool, rule: str) -> None:
    """ValueError ``<name> must be <rule>, got <value>`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def _finite_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_temperature(value) -> None:
    """ValueError ``temperature must be > 0, got <value>`` unless ``value`` is a finite number > 0: the sampling
    temperature of the rollouts and the update (T = 0 is greedy sampling, but the update's log-probs divide the
    logits by T: -inf, NaN ratios; T = inf samples uniformly). Every entry point that takes ``--temperature``
    applies this rule."""
    _require("temperature", value, _finite_number(value) and value > 0, "> 0")


def check_magrpo(m: MAGRPOConfig | dict) -> None:
    """The update's numeric fields (a :class:`MAGRPOConfig` or its fields as a dict), each checked on its own: a
    ValueError naming the field and the value (MAGRPOConfig's own check names groups of fields)."""
    v = dataclasses.asdict(m) if isinstance(m, MAGRPOConfig) else m
    for name in ("num_rollouts", "epochs", "num_minibatches"):
        _require(name, v[name], _int(v[name]) and v[name] >= 1, ">= 1")
    _require("micro_batch", v["micro_batch"], _int(v["micro_batch"]) and v["micro_batch"] >= 0, ">= 0")
    # T = 0 is greedy sampling, but the update's log-probs divide the logits by T (-inf, NaN ratios).
    check_temperature(v["temperature"])
    lr = v["learning_rate"]
    _require("learning_rate", lr, _finite_number(lr) and lr > 0, "a number > 0")
    for name in ("kl_beta", "weight_decay"):
        _require(name, v[name], _finite_number(v[name]) and v[name] >= 0, "a number >= 0")
    _require("clip_eps", v["clip_eps"], _finite_number(v["clip_eps"]) and 0 < v["clip_eps"] < 1, "in (0, 1)")
    _require("max_grad_norm", v["max_grad_norm"], _finite_number(v["max_grad_norm"]), "a finite number")


def replace_magrpo(m: MAGRPOConfig, **kw) -> MAGRPOConfig:
    """``m`` with the fields in ``kw`` replaced, checked field by field (:func:`check_magrpo`) before
    :class:`MAGRPOConfig`'s own checks (variant names, ``std_ddof``, ``optimizer``).

    Raises:
        ValueError: naming the field and the bad value.
    """
    check_magrpo({**dataclasses.asdict(m), **kw})
    return dataclasses.replace(m, **kw)


def lora_config(game: str, rank: int, *, shared_adapter: bool = False, **kw) -> LoRAConfig:
    """The run's :class:`lora.LoRAConfig`: one adapter per agent of ``game`` (one in all with ``shared_adapter``),
    ``rank``, alpha :data:`lora.config.ALPHA_PER_RANK` x rank unless ``alpha`` is given.

    Raises:
        ValueError: naming ``lora_rank`` (or ``lora_alpha``, ``lora_dropout``) and the bad value.
    """
    _require("lora_rank", rank, _int(rank) and rank >= 1, ">= 1")
    if kw.get("alpha") is not None:
        _require("lora_alpha", kw["alpha"], _finite_number(kw["alpha"]) and kw["alpha"] > 0, "a number > 0")
    if "dropout" in kw:
        d = kw["dropout"]
        _require("lora_dropout", d, _finite_number(d) and 0 <= d < 1, "in [0, 1)")
    if "targets" in kw:
        kw["targets"] = tuple(kw["targets"])
    n = 1 if shared_adapter else num_agents(game)
    alpha = kw.pop("alpha", None)
    base = LoRAConfig.for_rank(n, rank)
    return dataclasses.replace(base, **({"alpha": float(alpha)} if alpha is not None else {}), **kw)


def lora_dict(lcfg: LoRAConfig) -> dict:
    """``lcfg`` as JSON (the checkpoints' meta ``lora``): ``{num_adapters, rank, alpha, dropout, targets}``."""
    d = dataclasses.asdict(lcfg)
    d["targets"] = list(d["targets"])
    return d


def lora_differences(stored: dict, lcfg: LoRAConfig) -> dict[str, tuple]:
    """``{config.json key: (stored, current)}`` where a checkpoint's meta ``lora`` differs from ``lcfg``
    (``lora_rank``, ``lora_alpha``, ..., ``lora_num_adapters``)."""
    now = lora_dict(lcfg)
    return {LORA_PREFIX + k: (stored[k], v) for k, v in now.items() if k in stored and stored[k] != v}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run (saved to ``config.json`` as one flat object: :meth:`flat_dict`).

    The update's hyper-parameters live in :attr:`magrpo`, the adapters' in :attr:`lora`; the constructors and
    :meth:`replace` also take them by their flat names (``num_rollouts=2``, ``lora_rank=4``), as ``config.json``
    spells them.

    Raises:
        ValueError: from ``__post_init__``: a bad value, naming the field and the value.
    """

    # Game: cleanup, harvest, overcooked_aa, overcooked_fc.
    game: str
    # Preset the values came from: paper, cpu or smoke.
    preset: str
    # Run seed: training env seeds, LoRA init, sampling, update keys.
    seed: int = 0
    # --model: None = SmolLM2-135M-Instruct GGUF; a GGUF file or HF checkpoint dir; "tiny-random" (tests).
    model: str | None = None
    # The option-library variant (paper §6.1: each seed draws one; jaxopt_marl.options.LIBRARIES): a registered
    # name, never "auto" (--library auto is resolved with the seed's interface channel before the config is made).
    library: str = "canonical"
    # Steps per episode (paper §6.1: 150 Cleanup, 400 Harvest and Overcooked).
    episode_steps: int = 150
    # PA-MAGRPO rounds (not stated in the paper: 100). 0 = no training: the run evaluates the frozen base alone
    # (adapters off), the frozen cells of paper Table 2 (jaxopt_marl.pipeline; experiments.table2).
    rounds: int = PAPER_ROUNDS
    # LLM scoring: "sample" (two-line response, paper) or "choice_only" (one forward, letter distribution).
    # Sampling has no top-k / top-p; the temperature is magrpo.temperature.
    mode: str = "sample"
    # Longest sampled response ("sample" mode).
    max_new_tokens: int = 12
    # Action interface (jaxopt_marl.interfaces; paper §6.2 Table 2): "menu" (the method: guarded option menu),
    # "native" (primitive actions as letters, one call per step: Ablations A, C) or "compound_json" (a JSON
    # compound action, no menu and no guards: Ablation D; "sample" mode only). The menu and native interfaces run
    # the compiled rollout, compound_json the host loop (jaxopt_marl.rollout.Roller).
    interface: str = "menu"
    # Menu letters (LETTER_ORDERS; "menu" interface only): "shuffled" (paper §5.1) or "fixed" (the instances'
    # construction order, so a letter's meaning depends on the menu only through which instances it shows: a
    # learning-signal diagnostic that a model which cannot read can still learn from, not the method).
    letters: str = "shuffled"
    # Burn-in: this many solo plus this many joint episodes (uniform over the guardless menu; paper §5.1: 2000).
    burnin_episodes: int = PAPER_BURNIN_EPISODES
    # Burn-in episode length (None = episode_steps).
    burnin_steps: int | None = None
    # Guard synthesis: the fewest failures a guard must explain (paper §5.1 Stage 3: 5).
    min_support: int = MIN_SUPPORT
    # Evaluation episodes on seeds 10000, 10001, ... (paper §6.1: 20).
    eval_episodes: int = PAPER_EVAL_EPISODES
    # Also evaluate the frozen base (adapters off) on the same menu.
    eval_base: bool = True
    # Skip the update of rounds whose returns have no spread (all advantages 0): zero advantage is then exactly
    # zero update (every preset; jaxopt_marl.trainer.TrainConfig says why). False = update anyway (ablations).
    skip_zero_advantage: bool = True
    # Adapters evaluated: "best" = highest training-time team return (paper §6.1 checkpoint rule, ``best/``),
    # "final" = the adapters after the last round.
    eval_checkpoint: str = "best"
    # Solo test (paper §6.4): the first this-many evaluation seeds are played by each agent alone (the others
    # idled); 0 = skip. At most eval_episodes (the full-team returns of the evaluation are reused).
    solo_episodes: int = 0
    # How the compiled rollout cuts a wave's deciding rows into model calls: "auto" = per backend and mode
    # (:meth:`jaxopt_marl.compiled_rollout.ChunkConfig.for_backend`), "single" = one padded call per wave
    # (:meth:`~jaxopt_marl.compiled_rollout.ChunkConfig.single`: one compile; for tiny models and short runs).
    chunking: str = "auto"
    # Format warm-up (ours, not the paper: jaxopt_marl.format_warmup): this many supervised LoRA steps that teach
    # the two-line answer, merged into the frozen base before the first round, so "adapters off" (the KL
    # reference, the frozen-base evaluation) is the warmed-up base; 0 = none (the paper: PA-MAGRPO starts from the
    # frozen base). Menu interface, "sample" mode only (docs/runs/smollm2-format-warmup-cpu/: 15 steps).
    format_warmup: int = 0
    # PA-MAGRPO hyper-parameters: K (num_rollouts), the sampling temperature (read by the rollouts' policy too,
    # :meth:`policy_config`), learning rate, KL weight, PPO clip, epochs, gradient clip, micro-batch, one adapter
    # for all agents (shared_adapter, Ablation B), ...; each declared once, with its paper source, in MAGRPOConfig.
    magrpo: MAGRPOConfig = dataclasses.field(default_factory=lambda: MAGRPOConfig(micro_batch=MICRO_BATCH))
    # LoRA adapters on the frozen model (paper §6.1: rank 32 Cleanup / Harvest, 16 Overcooked; alpha = 2 x rank,
    # ours); None = rank 32 (:func:`lora_config`). num_adapters must be the game's agents (1 with shared_adapter).
    lora: LoRAConfig | None = None

    def __post_init__(self):
        check_game(self.game)
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; valid presets: {', '.join(PRESETS)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown scoring mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        check_interface(self.interface)
        if self.interface == INTERFACES[2] and self.mode != "sample":
            raise ValueError(
                f"interface compound_json needs mode 'sample' (there is no menu letter to score), got {self.mode!r}"
            )
        if self.letters not in LETTER_ORDERS:
            raise ValueError(f"unknown letter order {self.letters!r}; valid: {', '.join(LETTER_ORDERS)}")
        if self.letters == "fixed" and self.interface != INTERFACES[0]:
            raise ValueError(
                f"letters 'fixed' is a menu-interface option; interface {self.interface!r} has its own letters"
            )
        _require(
            "format_warmup",
            self.format_warmup,
            _int(self.format_warmup) and 0 <= self.format_warmup <= MAX_FORMAT_WARMUP,
            f"an integer in 0..{MAX_FORMAT_WARMUP} (supervised steps; 0 = no warm-up)",
        )
        if self.format_warmup and (self.interface != INTERFACES[0] or self.mode != "sample"):
            raise ValueError(
                f"format_warmup {self.format_warmup}: the format warm-up teaches the menu's two-line answer "
                f"(interface 'menu', mode 'sample'), got interface {self.interface!r}, mode {self.mode!r}"
            )
        if self.chunking not in CHUNKINGS:
            raise ValueError(f"unknown chunking {self.chunking!r}; valid: {', '.join(CHUNKINGS)}")
        if self.eval_checkpoint not in EVAL_CHECKPOINTS:
            raise ValueError(f"unknown eval checkpoint {self.eval_checkpoint!r}; valid: {', '.join(EVAL_CHECKPOINTS)}")
        _require("seed", self.seed, _int(self.seed) and self.seed >= 0, "an integer >= 0")
        from jaxopt_marl import options

        options.check_library_name(self.game, self.library)
        _require(
            "rounds", self.rounds, _int(self.rounds) and self.rounds >= 0, ">= 0 (0: evaluate the frozen base only)"
        )
        for name in (
            "episode_steps",
            "eval_episodes",
            "burnin_episodes",
            "max_new_tokens",
            "min_support",
        ):
            v = getattr(self, name)
            _require(name, v, _int(v) and v >= 1, ">= 1")
        if self.burnin_steps is not None:
            _require("burnin_steps", self.burnin_steps, _int(self.burnin_steps) and self.burnin_steps >= 1, ">= 1")
        if not (_int(self.solo_episodes) and 0 <= self.solo_episodes <= self.eval_episodes):
            raise ValueError(
                f"solo_episodes must be in 0..eval_episodes ({self.eval_episodes}), got "
                f"{self.solo_episodes!r} (the solo test reuses the evaluation's seeds)"
            )
        if not isinstance(self.magrpo, MAGRPOConfig):
            raise ValueError(f"magrpo must be a MAGRPOConfig, got {self.magrpo!r}")
        check_magrpo(self.magrpo)
        if self.lora is None:
            object.__setattr__(self, "lora", lora_config(self.game, 32, shared_adapter=self.magrpo.shared_adapter))
        _require("lora_rank", self.lora.rank, _int(self.lora.rank) and self.lora.rank >= 1, ">= 1")
        want = 1 if self.magrpo.shared_adapter else num_agents(self.game)
        if self.lora.num_adapters != want:
            raise ValueError(
                f"lora.num_adapters must be {want} ({self.game}, "
                f"{'shared adapter' if self.magrpo.shared_adapter else 'one adapter per agent'}), "
                f"got {self.lora.num_adapters!r}"
            )

    @property
    def lora_rank(self) -> int:
        """The adapters' rank (``config.json``'s ``lora_rank``)."""
        return self.lora.rank

    @property
    def num_agents(self) -> int:
        return num_agents(self.game)

    @property
    def frozen(self) -> bool:
        """``rounds == 0``: no training; the evaluation plays the frozen base alone (adapters off) on the usual
        seeds (:mod:`jaxopt_marl.evaluation`), paper Table 2's frozen cells."""
        return self.rounds == 0

    @property
    def reduced_budget(self) -> bool:
        """Anything but the paper preset is a reduced budget (said in the console and the report)."""
        return self.preset != "paper"

    @property
    def units(self) -> str:
        """Units of the team return (:attr:`jaxopt_marl.games.GameInfo.return_unit`): soups delivered
        (Overcooked) or apples eaten (Cleanup, Harvest)."""
        from jaxopt_marl.games import info

        return info(self.game).return_unit

    def policy_config(self):
        """The rollouts' :class:`jaxopt_marl.rollout.PolicyConfig`: its temperature is :attr:`magrpo`'s (the one
        the update's log-probs use), its mode, response budget and shared adapter this run's."""
        from jaxopt_marl.rollout import PolicyConfig

        return PolicyConfig(
            mode=self.mode,
            temperature=self.magrpo.temperature,
            max_new_tokens=self.max_new_tokens,
            shared_adapter=self.magrpo.shared_adapter,
            interface=self.interface,
            shuffle_letters=self.letters == LETTER_ORDERS[0],
        )

    def replace(self, **kw) -> RunConfig:
        """A copy with ``kw`` replaced; ``kw`` may name :attr:`magrpo`'s fields flat (``num_rollouts=2``) and
        :attr:`lora`'s with the ``lora_`` prefix (``lora_rank=4``: alpha follows as 2 x rank unless
        ``lora_alpha`` is given).

        Raises:
            ValueError: a bad value (naming the field and the value) or an unknown field.
        """
        m = {k: kw.pop(k) for k in list(kw) if k in MAGRPO_FIELDS}
        lo = {k[len(LORA_PREFIX) :]: kw.pop(k) for k in list(kw) if k in LORA_FLAT}
        unknown = set(kw) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown RunConfig field(s): {', '.join(sorted(unknown))}")
        magrpo = replace_magrpo(kw.pop("magrpo", self.magrpo), **m)
        lora = kw.pop("lora", None)
        game = kw.get("game", self.game)
        if lora is None:
            old = self.lora
            rank = lo.pop("rank", old.rank)
            keep = {} if rank != old.rank else {"alpha": old.alpha}  # a new rank: alpha = 2 x rank
            fields = {**keep, "dropout": old.dropout, "targets": old.targets, **lo}
            lora = lora_config(game, rank, shared_adapter=magrpo.shared_adapter, **fields)
        return dataclasses.replace(self, **kw, magrpo=magrpo, lora=lora)

    def flat_dict(self) -> dict:
        """The fields with :attr:`magrpo`'s inlined and :attr:`lora`'s as ``lora_<field>`` (no ``num_adapters``):
        the flat ``config.json`` layout."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("magrpo", "lora")}
        m = dataclasses.asdict(self.magrpo)
        lo = {LORA_PREFIX + k: v for k, v in lora_dict(self.lora).items() if k != "num_adapters"}
        return {**d, **lo, **m}

    @classmethod
    def paper(cls, game: str, **kw) -> RunConfig:
        """§6.1 hyper-parameters (:data:`PAPER`; the update's others: :class:`~jaxopt_marl.magrpo.MAGRPOConfig`)."""
        check_game(game)
        # The solo test shrinks with a smaller --eval-episodes (it reuses the evaluation's seeds).
        ev = kw.get("eval_episodes", PAPER_EVAL_EPISODES)
        solo = min(SOLO_PAPER[game], max(int(ev), 0)) if _int(ev) else SOLO_PAPER[game]
        g = PAPER[game]
        p = cls(
            game=game,
            preset="paper",
            episode_steps=g["episode_steps"],
            rounds=PAPER_ROUNDS,
            mode="sample",
            burnin_episodes=PAPER_BURNIN_EPISODES,
            eval_episodes=PAPER_EVAL_EPISODES,
            solo_episodes=solo,
            magrpo=MAGRPOConfig.paper(game, micro_batch=MICRO_BATCH),
            lora=lora_config(game, g["lora_rank"]),
        )
        return p.replace(**kw)

    @classmethod
    def cpu(cls, game: str, **kw) -> RunConfig:
        """The paper's optimiser settings on a budget for 2 CPU cores (about 30 minutes for Cleanup, README)."""
        # Measured on 2 idle cores with SmolLM2-135M (2026-11-30): a decision's prompt is ~245 tokens after the
        # 110-token system turn; rollouts ~1.2-2 decisions/s (letter-only scoring), the update ~2.8 s per decision
        # (theta_old and reference scoring + one PPO epoch, system turn run once per adapter). That buys ~100
        # decisions per round. Episode lengths are the shortest that give non-zero team returns with spread (else
        # no update runs): Cleanup needs >= 21 of 79 dirt cells cleaned before any apple grows (spec §1), which 15
        # steps never reached and 30 steps did (returns 0-2); Harvest has apples from step 0; an Overcooked soup
        # needs 3 onions, 20 cooking steps, a dish and a delivery.
        p = cls.paper(game)
        steps = {"cleanup": 30, "harvest": 20}.get(game, 80)
        return p.replace(
            **{
                **dict(
                    preset="cpu",
                    episode_steps=steps,
                    rounds=2,
                    num_rollouts=2,
                    epochs=1,
                    mode="choice_only",
                    burnin_episodes=100,
                    eval_episodes=2,
                    eval_base=True,
                    skip_zero_advantage=True,
                    solo_episodes=1,
                ),
                **kw,
            }
        )

    @classmethod
    def smoke(cls, game: str, **kw) -> RunConfig:
        """A few minutes: a tiny budget that tests the pipeline, on the tiny random model unless ``model`` is
        given (None = SmolLM2-135M-Instruct: the run warns that the budget is meaningless for a real model)."""
        p = cls.paper(game)
        return p.replace(
            **{
                **dict(
                    preset="smoke",
                    model=TINY_RANDOM,
                    episode_steps=12,
                    rounds=2,
                    num_rollouts=2,
                    lora_rank=2,
                    learning_rate=1e-2,
                    mode="sample",
                    max_new_tokens=8,
                    burnin_episodes=8,
                    eval_episodes=2,
                    eval_base=True,
                    solo_episodes=1,
                    chunking="single",
                ),
                **kw,
            }
        )

    @classmethod
    def from_preset(cls, preset: str, game: str, **kw) -> RunConfig:
        """``paper`` / ``cpu`` / ``smoke`` for ``game`` with ``kw`` replaced.

        Raises:
            ValueError: unknown preset or game, or a bad value (naming the field and the value).
        """
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
        check_game(game)
        return getattr(cls, preset)(game, **kw)


def smoke_warning(cfg: RunConfig) -> str | None:
    """The warning a smoke run with a real model prints (None for other presets and for ``tiny-random``)."""
    if cfg.preset != "smoke" or cfg.model == TINY_RANDOM:
        return None
    return (
        f"warning: --preset smoke with a real model ({cfg.model or DEFAULT_MODEL_NAME}): the smoke budget "
        f"({cfg.episode_steps}-step episodes, {cfg.rounds} rounds, lr {cfg.magrpo.learning_rate}, "
        f"{cfg.max_new_tokens} new tokens) tests the pipeline, not the method; its parse rates, KL and returns "
        f"are meaningless (use --preset cpu or paper for results)"
    )


__all__ = [
    "CHECKPOINT_RULE",
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "COMPOUND_MAX_NEW_TOKENS",
    "EVAL_SEED0",
    "GAMES",
    "INTERFACES",
    "MAX_FORMAT_WARMUP",
    "MODES",
    "PAPER",
    "PRESETS",
    "RESUME_MAY_DIFFER",
    "TINY_RANDOM",
    "RunConfig",
    "check_game",
    "check_interface",
    "interface_overrides",
    "lora_config",
    "lora_dict",
    "lora_differences",
    "num_agents",
    "replace_magrpo",
    "check_temperature",
    "smoke_warning",
]
