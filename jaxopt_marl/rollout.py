"""The LLM option policy and batched joint rollouts over the option menu (paper §5.1-§5.2, Algorithm 1 steps 2-4).

One call of :func:`collect` plays K joint episodes side by side:

1. a jitted advance (:func:`jaxopt_marl.macro.make_advance_batch` with :func:`make_traj_recorder`) steps every env
   until it has an agent at a decision point (or the episode ended), recording per-step positions, rewards, liveness
   and running options;
2. the host builds every deciding agent's menu (:func:`jaxopt_marl.menus.make_menu_fn`, letters shuffled with
   the episode-seeded :func:`jaxopt_marl.menus.decision_key`) and prompt (:mod:`jaxopt_marl.prompts`);
3. ONE batched LLM call (:meth:`LLMPolicy.decide`) serves every agent of every rollout needing a decision;
   rows carry the agent id, so each row runs its own stacked adapter (shared-adapter mode: adapter 0;
   reference policy: adapters off);
4. responses are parsed (:func:`jaxopt_marl.parsing.parse_response`); the chosen instances start
   (:func:`jaxopt_marl.macro.make_begin_batch`). A parse failure or an absent letter is counted and the agent
   waits: the ``wait`` option if the library has one on the menu, else one env step of the idle action. An
   option that fails at its start (an ``explicit:<reason>`` outcome at initiation: a guard miss) terminates
   at once and the agent idles that env step, deciding again at the next one, as in the burn-in
   (:func:`jaxopt_marl.burnin.run_burnin`): a shown option that cannot start costs a step, never a free
   retry, and an agent decides at most once per env step, so K x N x T bounds a rollout's decisions (the
   compiled rollout's buffers).

Scoring modes (:class:`PolicyConfig.mode`):

- ``sample`` (paper): sample the whole response (``state: ...`` / ``choice: X``) at the configured
  temperature (no top-k / top-p) with a KV cache; the system prompt's K/V is computed once per adapter.
- ``choice_only`` (fast, CPU): one forward per decision over the prompt plus the fixed response prefix
  ``state: <label>\\nchoice:`` (label from :func:`jaxopt_marl.prompts.state_label`); the letter is sampled
  from the model's next-token distribution restricted to the menu letters (tokens `` A``, `` B``, ...) at the
  temperature. Never a parse failure. The trained "response" is the single letter token.

Log-probs for training (theta_old and the reference) are NOT taken from the sampler: the trainer scores the
exact (prompt, response) token rows with :attr:`jaxopt_marl.train_step.TrainStep.prepare`, the program family
the update differentiates, so the first-epoch ratio is exactly 1. They are log-probs of the distribution the
rollout sampled from: tempered by the same temperature, and in ``choice_only`` mode normalised over the menu's
letter tokens only (``Decision.choices`` -> :attr:`jaxopt_marl.train_step.DecisionBatch.choice_ids`).

Every decision is traced (round, rollout, seed, step, aid, prompt, menu, response, parsed choice, parse
outcome, option, target, outcome) for ``runs/<name>/decisions/round_XXXX.jsonl``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxopt_marl import interfaces, macro, menus, parsing, prompts
from jaxopt_marl.config import TINY_RANDOM  # ``--model`` of the tiny random decoder (tests); re-exported here
from jaxopt_marl.records import OUTCOME_EFFECT_FAIL, OUTCOME_EXPLICIT_BASE, OUTCOME_SUCCESS
from lora import sampling
from lora.tokenizer import render_chat, stop_token_ids

MODES = ("sample", "choice_only")
# Prompt columns are padded to a multiple of this (bounds the number of compiled shapes).
LENGTH_BUCKET = 32


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """How the LLM turns a prompt into a menu letter."""

    # "sample" (whole two-line response, paper) or "choice_only" (one forward, letter distribution).
    mode: str = "sample"
    # Sampling temperature (paper: 0.7 Cleanup / Harvest, 0.9 Overcooked); no top-k / top-p.
    temperature: float = 0.7
    # Longest sampled response in tokens ("sample" mode).
    max_new_tokens: int = 12
    # One adapter for every agent (Ablation B) instead of adapter i for agent i.
    shared_adapter: bool = False
    # Run the shared system prompt once per adapter and reuse its KV cache.
    prefix_cache: bool = True
    # What the LLM is shown and answers (jaxopt_marl.interfaces): the option menu, native actions, compound JSON.
    interface: str = interfaces.MENU
    # Menu letters shuffled per decision (paper §5.1); False: in the instances' construction order (the "fixed"
    # diagnostic of jaxopt_marl.config.RunConfig.letters; menu interface only).
    shuffle_letters: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown scoring mode {self.mode!r}; known: {', '.join(MODES)}")
        interfaces.check_interface(self.interface)
        if self.interface == interfaces.COMPOUND_JSON and self.mode == "choice_only":
            raise ValueError(
                "the compound_json interface has no menu letter to score: use mode 'sample', not 'choice_only'"
            )
        if self.temperature < 0 or self.max_new_tokens < 1:
            raise ValueError(
                f"temperature must be >= 0 and max_new_tokens >= 1, got {self.temperature}, {self.max_new_tokens}"
            )

    @property
    def response_len(self) -> int:
        """Response columns of a packed decision."""
        return 1 if self.mode == "choice_only" else self.max_new_tokens


@dataclasses.dataclass
class Decision:
    """One LLM decision: token rows for training and the text for the trace."""

    prompt_ids: list
    response_ids: list
    text: str
    # Trace only: the response's log-prob at the sampling temperature (choice_only: among the menu letters).
    logp: float
    # choice_only: the menu's letter tokens the response was sampled among (None: whole vocabulary).
    choices: list | None = None
    # The full rendered chat string the model was given (prompt_ids' text): system and user turns, the
    # generation prompt and, in choice_only, the response prefix.
    prompt_text: str = ""


def _bucket(n: int, q: int) -> int:
    return max(q, -(-n // q) * q)


def left_pad(seqs, pad_id: int, rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``seqs`` (token-id lists, each at most ``width`` long, at most ``rows`` of them) left-padded into
    ``(ids int32[rows, width], mask bool[rows, width])``; rows past ``len(seqs)`` are all padding."""
    ids = np.full((rows, width), pad_id, np.int32)
    mask = np.zeros((rows, width), bool)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = s
        mask[i, width - len(s) :] = True
    return ids, mask


def _rows_bucket(n: int) -> int:
    """Batch rows: exact up to 8, even up to 16, then multiples of 8.

    A forward-only program compiles in well under a second on CPU, while padded rows cost full compute
    (measured on Cleanup, 2 cores: a 5-row wave padded to 8 rows took 3.5-3.9 s against ~2.1 s for 4 rows).
    """
    if n <= 8:
        return max(1, n)
    return -(-n // 2) * 2 if n <= 16 else -(-n // 8) * 8


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _letter_logits(graphdef, state, ids, mask, agent_ids, cache, letter_ids):
    """Next-token logits of the candidate letter tokens after each left-padded row: float32[B, L]."""
    model = nnx.merge(graphdef, state)
    return sampling.next_token_logits(model, ids, mask, agent_ids=agent_ids, cache=cache, vocab=letter_ids)


class LLMPolicy:
    """The frozen LLM with per-agent adapters as an option policy over lettered menus.

    Args:
        model: a :class:`lora.Decoder` with ``num_adapters`` = N agents (or 1 with ``shared_adapter``).
        tokenizer: its tokenizer (with a chat template).
        game: game name (system message).
        cfg: :class:`PolicyConfig`.
    """

    def __init__(self, model, tokenizer, game: str, cfg: PolicyConfig):
        self.model, self.tok, self.game, self.cfg = model, tokenizer, game, cfg
        self.graphdef, self.state = nnx.split(model)
        self.system = interfaces.system_message(game, cfg.interface)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.eos_ids = stop_token_ids(tokenizer)
        # Shared prefix: the rendered system turn (only if the full render starts with it).
        sys_text = render_chat(tokenizer, [{"role": "system", "content": self.system}], add_generation_prompt=False)
        probe = render_chat(tokenizer, [{"role": "system", "content": self.system}, {"role": "user", "content": "x"}])
        self.prefix_text = sys_text if probe.startswith(sys_text) else ""
        self.prefix_ids = self._encode([self.prefix_text])[0] if self.prefix_text else []
        # " A" .. " Z": the letter tokens after "choice:" (first token if a letter splits).
        self.letter_ids = np.array([self._encode([f" {c}"])[0][0] for c in menus.LETTERS], np.int32)
        self._caches: dict = {}

    # -- adapters ---------------------------------------------------------------------------------------

    def set_adapters(self, adapters) -> None:
        """Loads new adapter values (after an update); drops cached prefixes."""
        nnx.update(self.model, adapters)
        self.graphdef, self.state = nnx.split(self.model)
        self._caches = {}

    def adapter_ids(self, aids: np.ndarray, reference: bool) -> np.ndarray:
        """Adapter row per agent id: the agent's own, 0 (shared), or -1 (reference: adapters off)."""
        aids = np.asarray(aids, np.int32)
        if reference:
            return np.full_like(aids, -1)
        return np.zeros_like(aids) if self.cfg.shared_adapter else aids

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return [list(x) for x in self.tok(texts, add_special_tokens=False)["input_ids"]]

    def _prefix_cache(self, rows: np.ndarray, extra: int):
        """KV cache of the system prefix for each row's adapter id (computed once per adapter set)."""
        if not (self.cfg.prefix_cache and self.prefix_ids):
            return None
        ids = np.unique(rows)
        key = tuple(ids.tolist())
        if key not in self._caches:
            cache = sampling.prefill_prefix(
                self.graphdef, self.state, jnp.asarray([self.prefix_ids], jnp.int32), jnp.asarray(ids, jnp.int32)
            )
            self._caches = {key: (cache, ids)}
        cache, ids = self._caches[key]
        return cache.take(jnp.asarray(np.searchsorted(ids, rows), jnp.int32))

    # -- prompts ----------------------------------------------------------------------------------------

    def prompt_texts(self, user: str, label: str) -> tuple[str, str]:
        """(full chat prompt, response prefix) for one decision."""
        full = render_chat(self.tok, [{"role": "system", "content": self.system}, {"role": "user", "content": user}])
        prefix = f"state: {label}\nchoice:" if self.cfg.mode == "choice_only" else ""
        return full, prefix

    # -- the batched call ---------------------------------------------------------------------------------

    def decide(
        self,
        users: list[str],
        labels: list[str],
        aids: np.ndarray,
        n_letters: list[int],
        keys: jax.Array,
        reference: bool = False,
    ) -> list[Decision]:
        """One batched LLM call for every row (one row = one agent's decision).

        Args:
            users: user messages.
            labels: state labels (the ``choice_only`` response prefix).
            aids: int[R] acting agent of each row.
            n_letters: menu size of each row (``choice_only`` restricts sampling to these letters).
            keys: [R] sampling keys, one per row (:func:`decision_sample_key`).
            reference: adapters off (the frozen base policy).

        Returns:
            One :class:`Decision` per row, with ``prompt_ids`` = system + user (+ response prefix) tokens.
        """
        r = len(users)
        fulls = [self.prompt_texts(u, lab) for u, lab in zip(users, labels)]
        p = len(self.prefix_text)
        use_prefix = self.cfg.prefix_cache and bool(self.prefix_ids)
        suffix = self._encode([f[p:] + pre for f, pre in fulls])
        prompt_ids = [self.prefix_ids + s for s in suffix]
        rows_in = suffix if use_prefix else prompt_ids
        tp = _bucket(max(len(s) for s in rows_in), LENGTH_BUCKET)
        b = _rows_bucket(r)
        ids, mask = left_pad(rows_in, self.pad_id, b, tp)
        rows = np.zeros((b,), np.int32)
        rows[:r] = self.adapter_ids(aids, reference)
        if reference:
            rows[r:] = -1
        cache = self._prefix_cache(rows, tp) if use_prefix else None
        agent_ids = jnp.asarray(rows)
        # One key per row (padding rows reuse row 0's key; their output is dropped).
        keys = jnp.asarray(keys)
        keys = keys[jnp.asarray(np.minimum(np.arange(b), r - 1))]
        out = []
        if self.cfg.mode == "choice_only":
            logits = _letter_logits(
                self.graphdef,
                self.state,
                jnp.asarray(ids),
                jnp.asarray(mask),
                agent_ids,
                cache,
                jnp.asarray(self.letter_ids),
            )
            n_let = np.zeros((b,), np.int32)
            n_let[:r] = n_letters
            letters, logps = (
                np.asarray(x)
                for x in _choose_letters_jit(logits, jnp.asarray(n_let), keys, jnp.float32(self.cfg.temperature))
            )
            for i in range(r):
                j, n = int(letters[i]), max(1, int(n_letters[i]))
                out.append(
                    Decision(
                        prompt_ids=prompt_ids[i],
                        response_ids=[int(self.letter_ids[j])],
                        text=f"{fulls[i][1]} {menus.LETTERS[j]}",
                        logp=float(logps[i]),
                        choices=[int(x) for x in self.letter_ids[:n]],
                        prompt_text=fulls[i][0] + fulls[i][1],
                    )
                )
            return out
        gen = sampling.generate_rows(
            self.graphdef,
            self.state,
            jnp.asarray(ids),
            jnp.asarray(mask),
            keys,
            agent_ids,
            jnp.float32(self.cfg.temperature),
            cache,
            max_new_tokens=self.cfg.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
        )
        toks, lps, live = (np.asarray(x) for x in (gen.tokens, gen.logprobs_t, gen.mask))
        for i in range(r):
            resp = [int(t) for t in toks[i][live[i]]] or [int(toks[i, 0])]
            text = self.tok.decode([t for t in resp if t not in self.eos_ids], skip_special_tokens=True)
            out.append(
                Decision(
                    prompt_ids=prompt_ids[i],
                    response_ids=resp,
                    text=text,
                    logp=float(lps[i][live[i]].sum()),
                    prompt_text=fulls[i][0],
                )
            )
        return out


# ---------------------------------------------------------------------------------------------------------
# Jitted advance with per-step trajectories
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Traj:
    """Per-step trajectory buffers of a batch (host copy at the end)."""

    positions: Any  # int32[B, T, N, 2] (row, col)
    rewards: Any  # float32[B, T, N]
    alive: Any  # bool[B, T, N]
    options: Any  # int32[B, T, N] running option id (-1 idle)
    actions: Any  # int32[B, T, N] primitive action taken (replayable with the episode's env key)


def episode_keys(key: jax.Array, seeds: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-episode keys ``(env_keys, llm_keys)``, each ``[K]``: ``fold_in(fold_in(key, seed), 0 / 1)``.

    Every random draw of an episode comes from its own keys: env step t uses ``fold_in(env_key, t)``, decision
    d of agent a samples with ``decision_sample_key(llm_key, a, d)``. An episode therefore plays the same
    whichever other episodes share its batch, and however the decisions of a wave are batched for the LLM.
    """
    ep = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.asarray(seeds, jnp.uint32))
    return (jax.vmap(lambda k: jax.random.fold_in(k, 0))(ep), jax.vmap(lambda k: jax.random.fold_in(k, 1))(ep))


def decision_sample_key(llm_key: jax.Array, aid, decision) -> jax.Array:
    """The sampling key of agent ``aid``'s ``decision``-th LLM decision in an episode."""
    return jax.random.fold_in(jax.random.fold_in(llm_key, aid), decision)


def choose_letters(
    letter_logits: jax.Array, n_letters: jax.Array, keys: jax.Array, temperature
) -> tuple[jax.Array, jax.Array]:
    """``choice_only`` sampling: a letter among each row's first ``n`` menu letters at the temperature.

    Args:
        letter_logits: float32[B, L] next-token logits of the letter tokens " A", " B", ...
        n_letters: int32[B] menu size (letters beyond it are impossible; a row with 0 letters gets A).
        keys: [B] PRNG keys, one per row.
        temperature: scalar; <= 0 is greedy (argmax).

    Returns:
        ``(letter int32[B], logp float32[B])``: the letter index and its log-probability under the tempered
        distribution over the menu letters (0 at temperature <= 0).
    """
    n = jnp.maximum(n_letters, 1)
    t = jnp.maximum(temperature, 1e-6)
    letters = jnp.arange(letter_logits.shape[-1])[None]
    on_menu = letters < n[:, None]
    scaled = jnp.where(on_menu, letter_logits / t, -jnp.inf)
    drawn = jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)
    letter = jnp.where(temperature > 0, drawn, jnp.argmax(scaled, axis=-1).astype(jnp.int32))
    logp = sampling.tempered_logprobs(letter_logits, letter, t, candidates=jnp.where(on_menu, letters, -1))
    return letter, jnp.where(temperature > 0, logp, 0.0)


_choose_letters_jit = jax.jit(choose_letters)


def make_traj_recorder(lib, env, steps: int, frames: bool = False) -> macro.Recorder:
    """The per-step trajectory recorder (:data:`jaxopt_marl.macro.Recorder`) of the rollouts: writes step t's agent
    positions and liveness (:meth:`~jaxopt_marl.options.base.OptionLibrary.agent_view`), unshaped rewards
    (:meth:`~jaxopt_marl.options.base.OptionLibrary.step_rewards`), running options and primitive actions into the
    ``[T, ...]`` buffers of :func:`empty_traj` (one env). With ``frames`` the buffers also hold ``frames``
    uint8[T, H, W, 3], ``env.render`` after every step (costly). Shared by the host loop (:class:`Roller`) and the
    compiled rollout (:mod:`jaxopt_marl.compiled_rollout`)."""

    def record(tr, pre, m, running, action):
        t = jnp.clip(pre.step, 0, steps - 1)
        pos, alive = lib.agent_view(m.env)
        return dict(
            positions=tr["positions"].at[t].set(pos.astype(jnp.int32)),
            rewards=tr["rewards"].at[t].set(lib.step_rewards(pre, m.env)),
            alive=tr["alive"].at[t].set(alive),
            options=tr["options"].at[t].set(running),
            actions=tr["actions"].at[t].set(action),
            **({"frames": tr["frames"].at[t].set(env.render(m.env))} if frames else {}),
        )

    return record


def empty_traj(batch: int, steps: int, n: int, frame_shape: tuple[int, ...] | None = None) -> dict:
    """Zeroed trajectory buffers ``[batch, steps, ...]``; ``frame_shape`` (H, W, 3) adds ``frames``."""
    out = dict(
        positions=jnp.full((batch, steps, n, 2), -1, jnp.int32),
        rewards=jnp.zeros((batch, steps, n), jnp.float32),
        alive=jnp.zeros((batch, steps, n), bool),
        options=jnp.full((batch, steps, n), -1, jnp.int32),
        actions=jnp.full((batch, steps, n), -1, jnp.int32),
    )
    if frame_shape is not None:
        out["frames"] = jnp.zeros((batch, steps, *frame_shape), jnp.uint8)
    return out


# ---------------------------------------------------------------------------------------------------------
# Rollouts
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RolloutResult:
    """What :func:`collect` returns.

    Attributes:
        returns: float32[K] team return per rollout (unshaped: apples eaten / soups delivered).
        decisions: per decision ``(rollout k, aid, Decision)`` (LLM decisions only).
        traces: one dict per decision (JSON-ready).
        parse: parse outcome counts.
        traj: host trajectories (``positions``, ``rewards``, ``alive``, ``options``), ``[K, T, ...]``.
        stats: world stats per rollout at the end (dict of float32[K]).
        seconds: wall time; ``llm_seconds``: of which in LLM calls.
    """

    returns: np.ndarray
    decisions: list
    traces: list
    parse: parsing.ParseStats
    traj: dict
    stats: dict
    seconds: float
    llm_seconds: float
    #: Compiled rollouts only: the device outputs of each call (:class:`jaxopt_marl.compiled_rollout.CompiledResult`),
    #: the episodes kept from each call, sampled responses whose host parse differs from the device parse, and
    #: the decision waves played.
    device: list | None = None
    batches: list | None = None
    parse_mismatch: int = 0
    waves: int = 0
    #: Decisions the LLM was run for: all of them in the host loop; in the compiled ``choice_only`` rollout those
    #: whose menu had two or more letters (a one-letter draw needs no model).
    model_rows: int = 0

    @property
    def num_decisions(self) -> int:
        return len(self.traces)


class Roller:
    """Compiled pieces for one (game, library, guards, policy): call :meth:`collect` per round.

    The host loop of the module docstring. It plays every interface of :mod:`jaxopt_marl.interfaces`
    (``policy.cfg.interface``): ``menu`` and ``native`` (the game's primitive actions as a fixed letter menu:
    ``lib`` is wrapped in :class:`jaxopt_marl.interfaces.NativeLibrary`), both the compiled rollout's reference
    (:class:`jaxopt_marl.compiled_rollout.CompiledRoller` plays them in a run), and ``compound_json`` (a JSON
    object naming an option and its target; runs play it here). The last two have no guards: ``guards`` is
    ignored for them.

    Args:
        game: game name; env: the environment; lib: its option library; guards: ``CompiledGuards``;
        policy: :class:`LLMPolicy`; menu_seed: run seed mixed into the letter-shuffle keys.
    """

    def __init__(self, game: str, env, lib, guards, policy: LLMPolicy, menu_seed: int = 0):
        from jaxopt_marl import guards as G

        self.interface = interfaces.rollout_spec(policy.cfg)
        if self.interface.name == interfaces.NATIVE and not isinstance(lib, interfaces.NativeLibrary):
            lib = interfaces.NativeLibrary(lib)
        if self.interface.name != interfaces.MENU:  # no guards (native: nothing to guard; Ablation D: removed)
            guards = G.compile_guards([], lib.vocab)
        self.game, self.env, self.lib, self.policy = game, env, lib, policy
        self._replay: dict = {}
        self.steps = int(env.max_steps)
        self.n = lib.num_agents
        self.menu_seed = int(menu_seed)
        self.advance = macro.make_advance_batch(lib, env, make_traj_recorder(lib, env, self.steps))
        self._advance_frames = None  # built on the first collect(frames=True)
        self.begin = macro.make_begin_batch(lib)
        self.menu_fn = menus.make_menu_fn(lib, guards)
        self.snapshot = prompts.make_snapshot_fn(game, env)
        self.wait_id = lib.option_names.index("wait") if "wait" in lib.option_names else -1
        n = self.n
        init_one = lambda k: macro.init(lib, env, k, jnp.ones((n,), bool), jnp.bool_(False))
        self.init = jax.jit(jax.vmap(init_one))
        dk = lambda ep, aid, d: menus.decision_key(self.menu_seed, ep, aid, d)
        self.keys_fn = jax.jit(jax.vmap(jax.vmap(dk, (None, 0, 0)), (0, None, 0)))
        self.stats_fn = jax.jit(jax.vmap(lambda s: {**env.world_stats(s), "team_return": lib.team_return(s)}))

    def collect(
        self,
        seeds: list[int],
        key: jax.Array,
        *,
        round_idx: int = 0,
        reference: bool = False,
        progress: bool = False,
        desc: str = "rollouts",
        frames: bool = False,
        active: np.ndarray | None = None,
        adapters=None,
        base=None,
    ) -> RolloutResult:
        """Plays ``len(seeds)`` joint episodes (reset key ``PRNGKey(seed)``) to the end.

        Args:
            seeds: env seeds, one per rollout (also the episode id of the letter-shuffle keys).
            key: randomness of the env steps and the LLM sampling.
            round_idx: recorded in the traces.
            reference: play the frozen base (adapters off) instead of the adapters.
            progress: tqdm bar over env steps.
            frames: also record ``env.render`` after every step (``traj["frames"]`` uint8[K, T, H, W, 3]).
            active: bool[N] agents the policy plays (default all). An inactive agent is idled, as in the
                paper's solo test (§6.4): it never asks the LLM and starts the ``wait`` option (or, in a library
                without one, idles one step) at each of its decision points; its decisions are not traced.
            adapters: a stacked adapter state to play instead of the policy's current one (restored after), as
                :meth:`jaxopt_marl.compiled_rollout.CompiledRoller.collect` takes it; ``base`` must be None (the
                host loop plays the policy's own base model).

        Raises:
            ValueError: ``active`` of the wrong length, or a ``base``.
        """
        if base is not None:
            raise ValueError("the host rollout plays its policy's own base model: base must be None")
        if adapters is not None:
            held = nnx.state(self.policy.model, nnx.LoRAParam)
            self.policy.set_adapters(adapters)
            try:
                return self.collect(
                    seeds,
                    key,
                    round_idx=round_idx,
                    reference=reference,
                    progress=progress,
                    desc=desc,
                    frames=frames,
                    active=active,
                )
            finally:
                self.policy.set_adapters(held)
        t_start = time.perf_counter()
        lib, n, k_roll = self.lib, self.n, len(seeds)
        active = np.ones((n,), bool) if active is None else np.asarray(active, bool)
        if active.shape != (n,):
            raise ValueError(f"active must be bool[{n}], got shape {active.shape}")
        ms = self.init(jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds]))
        advance = self.advance
        frame_shape = None
        if frames:
            if self._advance_frames is None:
                self._advance_frames = macro.make_advance_batch(
                    self.lib, self.env, make_traj_recorder(self.lib, self.env, self.steps, frames=True)
                )
            advance = self._advance_frames
            frame_shape = jax.eval_shape(self.env.render, jax.tree.map(lambda x: x[0], ms.env)).shape
        traj = empty_traj(k_roll, self.steps, n, frame_shape)
        ndec = np.zeros((k_roll, n), np.int32)
        mem = [[prompts.Memory() for _ in range(n)] for _ in range(k_roll)]
        pending: dict[tuple[int, int], int] = {}
        asked: dict[tuple[int, int], int] = {}  # compound_json: this wave's decisions, for executor failures
        traces, decisions = [], []
        stats = parsing.ParseStats()
        force = np.zeros((k_roll,), bool)
        seeds_arr = jnp.asarray(np.asarray(seeds, np.int32))
        env_keys, llm_keys = episode_keys(key, seeds_arr)
        llm_s = 0.0
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=self.steps, desc=desc, unit="step", leave=False)
        it = 0
        while True:
            ms, traj, need, rec = advance(ms, env_keys, jnp.asarray(force), traj)
            self._outcomes(rec, pending, traces)
            need = np.asarray(need)
            done = np.asarray(ms.env.done)
            if bar is not None:
                bar.n = int(np.asarray(ms.env.step).min())
                bar.refresh()
            if not need.any() or done.all():
                break
            # 1. Menus and prompts for every deciding agent.
            menu = self.menu_fn(ms.env, self.keys_fn(seeds_arr, jnp.arange(n, dtype=jnp.int32), jnp.asarray(ndec)))
            m_opt, m_tgt, m_let = (np.asarray(x) for x in (menu.inst.opt, menu.inst.target, menu.letters))
            m_valid = np.asarray(menu.inst.valid)
            if not self.interface.shuffle:  # native: the actions in the simulator's order; compound: every instance
                m_let = interfaces.unshuffled_letters(self.interface, m_let, m_valid)
            snap = self.snapshot(ms.env)
            rows = [(b, a) for b in range(k_roll) for a in range(n) if need[b, a] and active[a]]
            choice = np.full((k_roll, n), -1, np.int32)
            for b, a in zip(*np.nonzero(need & ~active[None, :])):  # idled agents: wait (or idle)
                waits = np.flatnonzero((m_opt[b, a] == self.wait_id) & (m_let[b, a] >= 0))
                choice[b, a] = int(waits[0]) if (self.wait_id >= 0 and waits.size) else -1
            users, labels, n_let, menus_txt = [], [], [], []
            iface = self.interface.name
            for b, a in rows:
                sb = prompts.take(snap, b)
                text = menus.render_menu(lib, m_opt[b, a], m_tgt[b, a], m_let[b, a]) if self.interface.letters else ""
                users.append(interfaces.user_message(iface, self.game, sb, a, text, self.steps, mem[b][a], lib))
                labels.append(prompts.state_label(self.game, sb, a))
                n_let.append(int((m_let[b, a] >= 0).sum()) if self.interface.letters else 0)
                menus_txt.append(text)
            # 2. One batched LLM call.
            t0 = time.perf_counter()
            keys = jnp.stack([decision_sample_key(llm_keys[b], a, int(ndec[b, a])) for b, a in rows]) if rows else None
            outs = (
                self.policy.decide(users, labels, np.array([a for _, a in rows]), n_let, keys, reference=reference)
                if rows
                else []
            )
            llm_s += time.perf_counter() - t0
            # 3. Parse, choose, trace.
            for (b, a), d, text, n_l, user in zip(rows, outs, menus_txt, n_let, users):
                inst = -1
                if self.interface.letters:
                    res = parsing.parse_response(d.text, menus.LETTERS[:n_l])
                    if res.ok:
                        inst = menus.parse_choice(m_let[b, a], res.letter)
                else:
                    res, inst = interfaces.resolve_compound(
                        interfaces.parse_compound(d.text, lib), lib, m_opt[b, a], m_tgt[b, a], m_valid[b, a]
                    )
                    asked[(b, a)] = len(traces)
                stats.add(res)
                if inst < 0 and self.wait_id >= 0:
                    waits = np.flatnonzero((m_opt[b, a] == self.wait_id) & (m_let[b, a] >= 0))
                    inst = int(waits[0]) if waits.size else -1
                choice[b, a] = inst
                opt_name = lib.option_names[int(m_opt[b, a, inst])] if inst >= 0 else "idle"
                tgt = m_tgt[b, a, inst] if inst >= 0 else np.array([-1, -1])
                team = float(snap["team"][b])
                mem[b][a].remember(opt_name, team)
                pending[(b, a)] = len(traces)
                traces.append(
                    dict(
                        round=int(round_idx),
                        rollout=b,
                        seed=int(seeds[b]),
                        step=int(snap["step"][b]),
                        aid=int(a),
                        interface=iface,
                        prompt=user,
                        menu=text.split("\n")[1:],
                        response=d.text,
                        response_source="template" if self.policy.cfg.mode == "choice_only" else "model",
                        choice=res.letter,
                        parse=res.reason,
                        parse_fail=not res.ok,
                        option=opt_name,
                        target=None if tgt[0] < 0 else [int(tgt[1]), int(tgt[0])],
                        outcome="idle" if inst < 0 else "running",
                        logp=d.logp,
                        reference=bool(reference),
                        n_letters=n_l,
                        prompt_text=d.prompt_text,
                        prompt_ids=list(d.prompt_ids),
                        response_ids=list(d.response_ids),
                        **(
                            {}
                            if self.interface.letters
                            else {
                                "action": res.action,
                                "action_target": None if res.target is None else list(res.target),
                            }
                        ),
                    )
                )
                decisions.append((b, a, d))
                ndec[b, a] += 1
            ms, rec_fail = self.begin(ms, jnp.asarray(choice))
            if asked:  # compound_json: an executor that refused to start makes the parsed object a counted no-op
                self._executor_failures(rec_fail, asked, traces, stats)
                asked.clear()
            self._outcomes(rec_fail, pending, traces)
            # Agents left without an option (parse failure, no wait option) or whose option failed at its start idle
            # for one step (module docstring, step 4).
            force = (((choice < 0) & need) | np.asarray(rec_fail.valid)).any(axis=1)
            it += 1
        if bar is not None:
            bar.close()
        for idx in pending.values():
            if traces[idx]["outcome"] == "running":
                traces[idx]["outcome"] = "episode_end"
        st = {k: np.asarray(v) for k, v in self.stats_fn(ms.env).items()}
        host_traj = {k: np.asarray(v) for k, v in traj.items()}
        return RolloutResult(
            returns=st["team_return"].astype(np.float32),
            decisions=decisions,
            traces=traces,
            parse=stats,
            traj=host_traj,
            stats=st,
            seconds=time.perf_counter() - t_start,
            llm_seconds=llm_s,
            waves=it,
            model_rows=len(decisions),
        )

    def _executor_failures(self, rec, asked: dict, traces: list, stats: parsing.ParseStats) -> None:
        """compound_json: a valid object whose executor failed at start is re-counted as the no-op
        ``executor:<Reason>`` (in the parse counts and its trace's ``parse``); its outcome stays the explicit one."""
        valid = np.asarray(rec.valid)
        outcome = np.asarray(rec.outcome)
        for b, a in zip(*np.nonzero(valid)):
            idx = asked.get((int(b), int(a)))
            if idx is None or traces[idx]["parse"] != parsing.OK:
                continue
            reason = interfaces.EXECUTOR_PREFIX + self.lib.reasons[int(outcome[b, a]) - OUTCOME_EXPLICIT_BASE]
            stats.counts[parsing.OK] -= 1
            stats.counts[reason] += 1
            traces[idx]["parse"], traces[idx]["parse_fail"] = reason, True

    def replay_frames(self, seed: int, key, actions: np.ndarray) -> np.ndarray:
        """``uint8[T, H, W, 3]``: the episode of ``seed`` re-played from its recorded primitive actions, rendered
        after every step (:func:`replay_view`)."""
        return self.replay_view(seed, key, actions, self.env.render, "frames")

    def replay_view(self, seed: int, key, actions: np.ndarray, view, name: str):
        """:func:`replay_view` of this roller's env (compiled once per ``name``)."""
        return replay_view(self.env, self._replay, seed, key, actions, view, name)

    def _outcomes(self, rec, pending: dict, traces: list) -> None:
        """Writes finished options' outcomes into their decisions' traces."""
        valid = np.asarray(rec.valid)
        if not valid.any():
            return
        outcome = np.asarray(rec.outcome)
        for b, a in zip(*np.nonzero(valid)):
            idx = pending.pop((int(b), int(a)), None)
            if idx is None:
                continue
            o = int(outcome[b, a])
            traces[idx]["outcome"] = (
                "success"
                if o == OUTCOME_SUCCESS
                else "effect_fail"
                if o == OUTCOME_EFFECT_FAIL
                else f"explicit:{self.lib.reasons[o - OUTCOME_EXPLICIT_BASE]}"
            )


def replay_view(env, cache: dict, seed: int, key, actions: np.ndarray, view, name: str):
    """``view(state)`` after every step of the episode of ``seed`` re-played from its recorded primitive actions
    (int32[T, N]) with the same env keys (:func:`episode_keys`), stacked on a leading T axis (after the episode's
    end: the last state's). ``view`` is a JAX function of the env state returning an array or a pytree of arrays
    (e.g. ``env.render`` or ``lambda s: s.apples``), returned as NumPy arrays; ``cache`` (view name -> jitted
    program) keeps one compiled program per ``name``. Exactly the played episode, not a fresh sample."""
    if name not in cache:

        def replay(seed, key, actions):
            env_key = episode_keys(key, seed[None])[0][0]
            _, state = env.reset(jax.random.PRNGKey(seed))

            def step(s, a):
                acts = {ag: a[i] for i, ag in enumerate(env.agents)}
                _, nxt, _, _, _ = env.step_env(jax.random.fold_in(env_key, s.step), s, acts)
                nxt = jax.tree.map(lambda x, y: jnp.where(s.done, x, y), s, nxt)
                return nxt, view(nxt)

            _, out = jax.lax.scan(step, state, actions)
            return out

        cache[name] = jax.jit(replay)
    return jax.tree.map(np.asarray, cache[name](jnp.int32(seed), key, jnp.asarray(actions, jnp.int32)))


__all__ = [
    "Decision",
    "LLMPolicy",
    "MODES",
    "PolicyConfig",
    "Roller",
    "RolloutResult",
    "empty_traj",
    "make_traj_recorder",
    "replay_view",
]


# ---------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2's tokenizer from the default GGUF's metadata only (no weights are dequantised)."""
    import gguf

    from lora import gguf_loader
    from lora.tokenizer import tokenizer_from_gguf_fields

    path = gguf_loader.default_gguf_path()
    reader = gguf.GGUFReader(path)
    meta = {k: gguf_loader._field_value(f) for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    return tokenizer_from_gguf_fields(meta, path)


def load_policy_model(spec: str | None, lora_cfg, seed: int = 0):
    """``(model, tokenizer)`` for ``--model``: None = SmolLM2 GGUF, a path (GGUF or HF dir), or ``tiny-random``.

    ``tiny-random`` is a 2-layer random decoder (``lora.ModelConfig.tiny``) on SmolLM2's tokenizer: tests only.
    """
    import lora

    if spec == TINY_RANDOM:
        tok = smollm2_tokenizer()
        cfg = lora.ModelConfig.tiny(vocab_size=len(tok))
        model = lora.Decoder(cfg, lora_cfg, rngs=nnx.Rngs(seed))
        return model, tok
    return lora.load_model(spec, lora=lora_cfg, seed=seed)


__all__ += ["TINY_RANDOM", "load_policy_model", "smollm2_tokenizer"]
