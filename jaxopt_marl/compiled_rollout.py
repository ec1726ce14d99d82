"""The compiled rollout (paper §5.1-§5.2, Algorithm 1 steps 2-4): K joint episodes with the LLM in the loop,
as ONE jitted program.

One call of :meth:`CompiledRoller.collect` runs a ``lax.while_loop`` over *decision waves*, vmapped over the
K rollouts and N agents, with static shapes throughout. A wave:

1. the macro-action advance (:func:`jaxopt_marl.macro.make_advance_to_decision` with the trajectory recorder
   :func:`jaxopt_marl.rollout.make_traj_recorder`, vmapped over K): every env steps
   until one of its agents is at a decision point (or its episode ended); per-step positions, rewards,
   liveness, running options and primitive actions go into ``[K, T, N]`` buffers;
2. every agent's menu (:func:`jaxopt_marl.menus.build_menu`): instance table, compiled guards, the live
   NoPath / TargetAbsent re-check, the episode-seeded letter shuffle (:func:`jaxopt_marl.menus.decision_key`);
3. every deciding agent's prompt as token ids, assembled on the device from pre-tokenized fragments
   (:class:`jaxopt_marl.prompt_ids.PromptIds`): exactly the tokenizer's encoding of the rendered chat text;
4. the LLM over the deciding rows only, *compacted* into chunks (below), each row on its agent's adapter
   (adapter 0 in shared-adapter mode, adapters off for the reference policy), every row continuing the
   shared system turn's K/V, computed once per adapter at the start of the call:

   - ``choice_only``: one forward; the letter is sampled at the temperature over the menu's letter tokens;
   - ``sample`` (paper): the response is sampled with the KV cache (:func:`lora.sampling.decode`), decoded
     to bytes and parsed on the device (:mod:`jaxopt_marl.parse_device`), failures counted by reason;

5. the chosen instances start (:func:`jaxopt_marl.macro.begin`); a parse failure or a letter not on the menu
   makes the agent wait (the ``wait`` instance, else one idle step), as in the host loop;
6. every decision (prompt ids, response ids, log-prob at the temperature, letter, menu, option, target, and
   later its outcome) goes into preallocated ``[D]`` device arrays (:class:`DecisionBuffers`, D = K N T).

**Chunks.** Rows that do not decide cost no model compute (in ``choice_only`` neither do rows whose menu has
a single letter: the draw has one outcome and its log-prob is exactly 0), and padding is bounded: the wave's
deciding rows are sorted by prompt length (longest first) and cut into chunks whose row count comes from a static set
(:class:`ChunkConfig`: on CPU single rows, or 8, 4, 2, 1 taken greedily when decoding, so no row is ever padded;
on a GPU a few larger sizes with padding, since there a row costs almost nothing) and whose prompt columns are the chunk's longest
prompt rounded up to ``length_step`` tokens. One ``lax.switch`` branch per (rows, columns) pair runs the
model on exactly that shape. The host path (:class:`jaxopt_marl.rollout.Roller`) pads a wave's rows to
``_rows_bucket`` and its columns to 32, so the compiled chunks never pay more padding than it did.

**Randomness.** Every draw of an episode comes from its own keys (:func:`jaxopt_marl.rollout.episode_keys`):
the env step t of episode k uses ``fold_in(env_key_k, t)``, decision d of agent a samples with
``decision_sample_key(llm_key_k, a, d)`` (token i of a sampled response: ``fold_in(that, i)``). So an episode
plays identically whichever episodes share its batch and however its wave's rows are chunked, and the host
loop, which uses the same keys, is a reference for the compiled one.

**Interfaces.** ``menu`` (the method) and ``native`` (paper §4: the game's primitive actions as a fixed-letter
menu of one-step options, :class:`jaxopt_marl.interfaces.NativeLibrary`, no guards) run this program; with
``native`` every present agent decides at every env step (one wave per step), the letters are
:func:`jaxopt_marl.interfaces.fixed_letters` instead of the shuffle, and the prompts are the native template of
:class:`jaxopt_marl.prompt_ids.PromptIds`. ``compound_json`` plays the host loop.

Nothing leaves the device during a call (``jax.transfer_guard("disallow")`` holds around it); the host
decodes the buffers into the ``decisions/*.jsonl`` traces afterwards (:meth:`CompiledRoller.traces`), and the
PA-MAGRPO batch is built from them on the device (:func:`decision_batch`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxopt_marl import interfaces, macro, menus, parse_device, parsing, prompt_ids, prompts, rollout
from jaxopt_marl import progress as progress_lib
from jaxopt_marl.records import OUTCOME_EFFECT_FAIL, OUTCOME_EXPLICIT_BASE, OUTCOME_SUCCESS
from jaxopt_marl.train_step import DecisionBatch
from lora import sampling
from lora.tokenizer import render_chat, stop_token_ids

#: Outcome codes of a decision besides the records' (0 success, 1 effect_fail, 2 + k explicit reason k):
#: its option is still running, the episode ended while it ran, or no option started (the agent idled).
OUTCOME_RUNNING, OUTCOME_EPISODE_END, OUTCOME_IDLE = -1, -2, -3
#: Parse outcome codes (index into :data:`jaxopt_marl.parse_device.REASON_CODES`).
REASON_OK = 0
REASON_INVALID = parse_device.REASON_CODES.index(parsing.INVALID_LETTER)


@dataclasses.dataclass(frozen=True)
class ChunkConfig:
    """How a wave's deciding rows are cut into model calls (see the module docstring).

    Attributes:
        row_sizes: chunk row counts, descending (static shapes of the compiled branches).
        pad_rows: False: the largest size <= the rows left (with 1 in ``row_sizes`` no row is ever padded);
            True: the smallest size >= the rows left (padding rows, fewer calls; for a GPU).
        length_step: prompt columns are the chunk's longest prompt rounded up to a multiple of this.
    """

    row_sizes: tuple[int, ...] = (8, 4, 2, 1)
    pad_rows: bool = False
    length_step: int = 32

    def __post_init__(self):
        sizes = tuple(int(s) for s in self.row_sizes)
        if not sizes or any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes), reverse=True):
            raise ValueError(f"row_sizes must be distinct positive sizes in descending order, got {self.row_sizes}")
        if not self.pad_rows and sizes[-1] != 1:
            raise ValueError(f"row_sizes without padding must end with 1, got {self.row_sizes}")
        if self.length_step < 1:
            raise ValueError(f"length_step must be >= 1, got {self.length_step}")

    @classmethod
    def for_backend(cls, backend: str | None = None, rows: int = 28, mode: str = "choice_only") -> ChunkConfig:
        """Defaults per backend and scoring mode.

        - CPU, ``choice_only``: single rows, 32-token columns. Prefill is compute-bound there: a SmolLM2 row of
          256 tokens cost 0.99 s alone and 0.98 s per row in a batch of 8 (2-core CPU, 2026-12-01), so batching
          buys nothing, while each row's own columns pad less than a batch padded to its longest row, and there
          are fewer branches to compile.
        - CPU, ``sample``: (8, 4, 2, 1) exact, 64-token columns: a decode step streams every weight whatever the
          rows (memory-bound), so decoding rows together is what pays.
        - GPU/TPU: two padded sizes, the power of two >= ``rows`` (at least 8) and 8, with 128-token columns: a
          wave of SmolLM2 rows is launch-bound there, so few, full calls win, and the branch count (10 for a
          Cleanup prompt limit of ~615 tokens) bounds the compile, which comes out of a 10-minute device call.
          Not measured on a device yet (issue #11/#12).
        """
        backend = backend or jax.default_backend()
        if backend == "cpu":
            return cls(row_sizes=(1,)) if mode == "choice_only" else cls(row_sizes=(8, 4, 2, 1), length_step=64)
        top = max(8, 1 << (max(rows, 1) - 1).bit_length())
        return cls(row_sizes=tuple(sorted({top, 8}, reverse=True)), pad_rows=True, length_step=128)

    @classmethod
    def single(cls, rows: int) -> ChunkConfig:
        """One branch: every wave runs as one call of ``rows`` rows padded to the prompt limit.

        For short runs with a tiny model (the smoke preset, the tests), where a row costs almost nothing and
        compiling a branch per (rows, columns) pair is what takes the time: a 12-step Overcooked smoke run in
        ``sample`` mode compiled 33 decode branches under :meth:`for_backend` (about 5 minutes cold on 2 cores).
        """
        return cls(row_sizes=(max(int(rows), 1),), pad_rows=True, length_step=1 << 20)


class DecisionBuffers(NamedTuple):
    """Every LLM decision of one :meth:`CompiledRoller.collect` call, in order, ``[D]`` leading (D = K N T).

    Decisions ``0 .. count - 1`` are real (in wave order, then rollout, then agent, as the host loop traces
    them); the rest are unused.

    Attributes:
        count: int32[] decisions taken.
        rollout, aid, step, wave: int32[D] rollout index k, acting agent, env step, decision wave.
        prompt: int32[D, P] prompt tokens after the shared system turn, left-padded (P = prompt limit).
        prompt_len: int32[D] real prompt tokens.
        response: int32[D, M] response tokens (``choice_only``: the letter token; sample: up to M tokens,
            the end token included).
        response_mask: bool[D, M] real response tokens.
        logp: float32[D] the response's log-prob at the rollout temperature (``choice_only``: over the menu's
            letter tokens) -- the distribution it was sampled from.
        letter: int32[D] chosen letter index (0 = A), -1 on a parse failure.
        reason: int32[D] parse outcome code (0 = ok; :data:`jaxopt_marl.parse_device.REASON_CODES`).
        n_letters: int32[D] menu size.
        label: int32[D] the state label code (``prompts.STATE_LABELS``).
        team: float32[D] the team return when the decision was taken (apples / deliveries).
        menu_opt, menu_target, menu_letters: int32[D, I], int32[D, I, 2], int32[D, I] the menu shown.
        inst: int32[D] instance started (-1 none: the agent idled).
        option: int32[D] its option id (-1 idle); target: int32[D, 2] (row, col), -1 none.
        outcome: int32[D] record outcome code, or :data:`OUTCOME_RUNNING` / ``EPISODE_END`` / ``IDLE``.
    """

    count: jax.Array
    rollout: jax.Array
    aid: jax.Array
    step: jax.Array
    wave: jax.Array
    prompt: jax.Array
    prompt_len: jax.Array
    response: jax.Array
    response_mask: jax.Array
    logp: jax.Array
    letter: jax.Array
    reason: jax.Array
    n_letters: jax.Array
    label: jax.Array
    team: jax.Array
    menu_opt: jax.Array
    menu_target: jax.Array
    menu_letters: jax.Array
    inst: jax.Array
    option: jax.Array
    target: jax.Array
    outcome: jax.Array


class CompiledResult(NamedTuple):
    """Device outputs of one compiled collect (see :meth:`CompiledRoller.collect`).

    Attributes:
        decisions: :class:`DecisionBuffers`.
        traj: dict of ``[K, T, N, ...]`` per-step buffers (positions, rewards, alive, options, actions).
        stats: world stats at the end, dict of ``[K]`` (``team_return`` included).
        parse_counts: int32[5] parse outcomes by reason code.
        waves: int32[] decision waves played.
        feats: int32[D, F] the read-set features of each decision's chosen instance at initiation (-1 where no
            instance started), only with ``CompiledRoller(burnin=True)``; None otherwise (the training path).
        model_rows: int32[] decisions the LLM ran for (in ``choice_only``: those with two or more letters).
    """

    decisions: DecisionBuffers
    traj: dict
    stats: dict
    parse_counts: jax.Array
    waves: jax.Array
    feats: jax.Array | None = None
    model_rows: jax.Array | None = None


def _empty_buffers(d: int, p: int, m: int, i: int) -> DecisionBuffers:
    z = lambda *shape: jnp.zeros(shape, jnp.int32)
    neg = lambda *shape: jnp.full(shape, -1, jnp.int32)
    return DecisionBuffers(
        count=jnp.zeros((), jnp.int32),
        rollout=z(d),
        aid=z(d),
        step=z(d),
        wave=z(d),
        prompt=z(d, p),
        prompt_len=z(d),
        response=z(d, m),
        response_mask=jnp.zeros((d, m), bool),
        logp=jnp.zeros((d,), jnp.float32),
        letter=neg(d),
        reason=z(d),
        n_letters=z(d),
        label=z(d),
        team=jnp.zeros((d,), jnp.float32),
        menu_opt=neg(d, i),
        menu_target=neg(d, i, 2),
        menu_letters=neg(d, i),
        inst=neg(d),
        option=neg(d),
        target=neg(d, 2),
        outcome=jnp.full((d,), OUTCOME_IDLE, jnp.int32),
    )


def _rec_outcome(rec: macro.Rec) -> jax.Array:
    """The records' outcome codes (0 success, 1 effect_fail, 2 + k explicit), as the host traces spell them."""
    return rec.outcome.astype(jnp.int32)


def _branch_index(rem: jax.Array, sizes: np.ndarray, pad_rows: bool) -> jax.Array:
    """Index into ``sizes`` (descending) of the next chunk's row count for ``rem`` rows left."""
    s = jnp.asarray(sizes)
    if pad_rows:  # smallest size >= rem, else the largest
        fits = s >= rem
        return jnp.where(fits.any(), len(sizes) - 1 - jnp.argmax(fits[::-1]), 0).astype(jnp.int32)
    fits = s <= rem  # largest size <= rem (sizes end with 1)
    return jnp.where(fits.any(), jnp.argmax(fits), len(sizes) - 1).astype(jnp.int32)


class CompiledRoller:
    """Compiled rollouts for one (game, library, guards, model, policy config, batch size K).

    Args:
        game: game name; env: the environment; lib: its option library; guards: ``CompiledGuards``.
        model: the :class:`lora.Decoder` with its stacked adapters (N, or 1 with ``cfg.shared_adapter``).
        tokenizer: its tokenizer (with a chat template).
        cfg: :class:`jaxopt_marl.rollout.PolicyConfig` (mode, temperature, response budget, shared adapter, and the
            interface: ``menu``, or ``native``, which plays ``lib`` wrapped in
            :class:`jaxopt_marl.interfaces.NativeLibrary` with no guards (``guards`` is ignored), the letters fixed
            in the simulator's action order (:func:`jaxopt_marl.interfaces.fixed_letters`) and the native prompt
            (:class:`jaxopt_marl.prompt_ids.PromptIds` ``interface="native"``), exactly as the host loop plays it).
        menu_seed: run seed mixed into the letter-shuffle keys.
        batch: K, the rollouts of one call (each call compiles once per K; evaluation plays in batches of K).
        chunks: :class:`ChunkConfig` (default: :meth:`ChunkConfig.for_backend`).
        max_prompt_len: the prompt limit P (tokens after the system turn); default: the worst case of the
            game's prompt structure (``PromptIds.max_len``).
        burnin: the burn-in control's program (paper §5.1; :func:`jaxopt_marl.burnin.run_llm_burnin`), with three
            differences from the training path's (which ``burnin=False`` leaves exactly as it was): episode
            ``s`` resets with ``split(fold_in(key, s))[0]``, the uniform burn-in's reset key of episode ``s``
            under ``key = PRNGKey(seed)``, so both burn-ins start from the same states; only the ``active``
            agents decide, the others never do and emit the idle action (solo episodes, as
            :func:`jaxopt_marl.macro.init`'s ``acting``); an agent whose chosen option failed explicitly at its
            start idles one step before it decides again (as :func:`jaxopt_marl.macro.make_macro_step`);
            and the chosen instances' read-set features at initiation come back in ``CompiledResult.feats``.

    Raises:
        ValueError: an interface with no device template (``compound_json``: the host loop plays it), ``native``
            with ``burnin``, a ``prompt`` built for another interface or mode, a menu longer than the letters,
            a prompt limit below the worst case, a vocabulary whose
            letters " A".." Z" are not single tokens (from :class:`jaxopt_marl.prompt_ids.PromptIds`, naming
            the game, the length and the limit), or a model whose adapter count does not fit the mode. All
            before any compute.
    """

    def __init__(
        self,
        game: str,
        env,
        lib,
        guards,
        model,
        tokenizer,
        cfg: rollout.PolicyConfig,
        *,
        menu_seed: int = 0,
        batch: int = 4,
        chunks: ChunkConfig | None = None,
        max_prompt_len: int | None = None,
        prompt: prompt_ids.PromptIds | None = None,
        burnin: bool = False,
    ):
        from jaxopt_marl import guards as G
        from lora import split_model

        # The interface (jaxopt_marl.interfaces): menu, or native (the primitive actions as a fixed-letter menu of
        # one-step options, no guards), as the host loop (rollout.Roller) plays them; compound_json has no letters.
        self.interface = interfaces.rollout_spec(cfg)
        if cfg.interface not in prompt_ids.DEVICE_INTERFACES:
            raise ValueError(
                f"{game}: interface {cfg.interface!r} plays the host loop (jaxopt_marl.rollout.Roller); the compiled "
                f"rollout plays {', '.join(prompt_ids.DEVICE_INTERFACES)}"
            )
        if cfg.interface == interfaces.NATIVE:
            if burnin:
                raise ValueError(f"{game}: the burn-in control plays the menu interface, not {cfg.interface!r}")
            if not isinstance(lib, interfaces.NativeLibrary):
                lib = interfaces.NativeLibrary(lib)
            guards = G.compile_guards([], lib.vocab)  # nothing to guard: every action is always on the menu
        self.game, self.env, self.lib, self.guards, self.cfg = game, env, lib, guards, cfg
        self.burnin = bool(burnin)
        self.tok = tokenizer
        self.n = lib.num_agents
        self.steps = int(env.max_steps)
        self.batch = int(batch)
        if self.batch < 1:
            raise ValueError(f"batch (K rollouts per call) must be >= 1, got {batch}")
        self.menu_seed = int(menu_seed)
        n_adapters = model.lora_cfg.num_adapters if model.lora_cfg is not None else 0
        want = 1 if cfg.shared_adapter else self.n
        if n_adapters != want:
            raise ValueError(
                f"{game}: the model has {n_adapters} adapters, the policy needs {want} "
                f"({'shared adapter' if cfg.shared_adapter else 'one per agent'})"
            )
        # ``prompt``: the caller's, already built for this game, tokenizer, mode and episode length (checked once).
        self.prompt = prompt or prompt_ids.PromptIds(
            game,
            env,
            lib,
            tokenizer,
            mode=cfg.mode,
            max_steps=self.steps,
            max_len=max_prompt_len,
            interface=cfg.interface,
        )
        if self.prompt.interface != cfg.interface or self.prompt.mode != cfg.mode:
            raise ValueError(
                f"{game}: the prompt template is for interface {self.prompt.interface!r}, mode "
                f"{self.prompt.mode!r}; the policy plays {cfg.interface!r}, {cfg.mode!r}"
            )
        self.chunks = chunks or ChunkConfig.for_backend(rows=self.batch * self.n, mode=cfg.mode)
        self.model = model
        self.graphdef, _, _ = split_model(model)
        self.wait_id = lib.option_names.index("wait") if "wait" in lib.option_names else -1
        self.idle_code = len(lib.option_names)
        self.eos_ids = stop_token_ids(tokenizer)
        self.pad_id = int(self.prompt.pad_id)
        self.letter_ids = np.asarray(self.prompt.letter_ids, np.int32)
        self.response_len = cfg.response_len
        self.byte_table = parse_device.ByteTable.from_tokenizer(tokenizer) if cfg.mode == "sample" else None
        # Text around the user message in the rendered chat, for the traces' ``prompt`` field.
        sentinel = "\x00USER\x00"
        full = render_chat(
            tokenizer, [{"role": "system", "content": self.prompt.system}, {"role": "user", "content": sentinel}]
        )
        head, tail = full[len(self.prompt.prefix_text) :].split(sentinel)
        self._user_head, self._user_tail = head, tail
        # This process's first device (in a multi-process run jax.devices()[0] belongs to process 0).
        self._device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        self._fn = jax.jit(self._collect)
        # The same program with a progress callback after every wave (built on the first collect(progress=True)).
        self._fn_progress = jax.jit(functools.partial(self._collect, progress=True))
        self._replay = {}  # view name -> jitted replay program (replay_view)

    # -- what the trainer reads (the host loop's LLMPolicy offers the same) --------------------------------

    @classmethod
    def for_run(cls, run, env, lib, guards, model, tokenizer, *, batch: int, prompt=None) -> CompiledRoller:
        """The roller of a run (a :class:`jaxopt_marl.config.RunConfig` ``run``): its policy configuration
        (``run.policy_config()``: mode, temperature, shared adapter), the letter shuffles of its interface seed
        channel (:func:`jaxopt_marl.seeding.interface_seed`) and its ``chunking`` (``single``:
        :meth:`ChunkConfig.single` over the ``batch`` x agents rows; else the backend's default), ``batch``
        episodes a call. One construction for the training run (:mod:`jaxopt_marl.pipeline`) and the runs it is
        replayed from (``experiments.crossplay``). Raises ValueError as the constructor does."""
        from jaxopt_marl import seeding

        chunks = ChunkConfig.single(batch * run.num_agents) if run.chunking == "single" else None
        return cls(
            run.game,
            env,
            lib,
            guards,
            model,
            tokenizer,
            run.policy_config(),
            menu_seed=seeding.interface_seed(run.seed),
            batch=batch,
            chunks=chunks,
            prompt=prompt,
        )

    @property
    def policy(self) -> CompiledRoller:
        """The roller itself: it holds what :class:`jaxopt_marl.trainer.Trainer` reads from a policy
        (``model``, ``cfg``, ``prefix_ids``, ``pad_id``, :meth:`set_adapters`)."""
        return self

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        """Token ids of the shared system turn (every decision's prompt continues it)."""
        return tuple(self.prompt.prefix_ids)

    def set_adapters(self, adapters) -> None:
        """Loads new adapter values into the model (the next :meth:`collect` plays them)."""
        nnx.update(self.model, adapters)

    # -- the program ------------------------------------------------------------------------------------

    @property
    def max_decisions(self) -> int:
        """D: every agent of every rollout decides at most once per env step."""
        return self.batch * self.n * self.steps

    def _model_rows(self, model, kv, ids, mask, adapter, keys, live):
        """The LLM on one chunk of rows. ``choice_only``: ``(letter logits float32[s, 26],)``; ``sample``:
        ``(tokens int32[s, M], mask bool[s, M], logp float32[s])`` (log-prob at the temperature)."""
        cfg = self.cfg
        cache = kv.take(jnp.where(adapter >= 0, adapter, kv.rows - 1))
        if cfg.mode == "choice_only":
            vocab = jnp.asarray(self.letter_ids, jnp.int32)
            return (sampling.next_token_logits(model, ids, mask, agent_ids=adapter, cache=cache, vocab=vocab),)
        gen = sampling.decode(
            model,
            ids,
            mask,
            sampling.row_key_draw(keys),
            agent_ids=adapter,
            temperature=jnp.float32(cfg.temperature),
            prefix_cache=cache,
            max_new_tokens=cfg.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            live_rows=live,
        )
        return gen.tokens, gen.mask, jnp.where(gen.mask, gen.logprobs_t, 0.0).sum(axis=1)

    def _wave_llm(self, model, kv, ids, lens, adapter, keys, n_let, llm_row):
        """The LLM over a wave's deciding rows (flattened ``[R]``), compacted into chunks (module docstring).

        Only the model runs inside the chunk branches; the letter draw (``choice_only``) and the response
        parse (``sample``) run once over all R rows afterwards (cheap, and compiled once).

        Returns:
            ``(letter int32[R] (-1 on failure), reason int32[R], logp float32[R], response int32[R, M],
            response_mask bool[R, M])``; meaningful on the deciding rows.
        """
        r, p = ids.shape
        m = self.response_len
        sizes = np.asarray(self.chunks.row_sizes, np.int32)
        step = self.chunks.length_step
        n_len = -(-p // step)
        widths = [min((j + 1) * step, p) for j in range(n_len)]
        smax = int(sizes[0])
        nd = llm_row.sum().astype(jnp.int32)
        # Deciding rows first, longest prompt first (stable: ties keep row order).
        order = jnp.argsort(jnp.where(llm_row, -lens, 1), stable=True).astype(jnp.int32)
        order = jnp.concatenate([order, jnp.zeros((smax,), jnp.int32)])

        def branch(s: int, width: int):
            def run(c0, out):
                ok = (c0 + jnp.arange(s, dtype=jnp.int32)) < nd
                rows = jnp.where(ok, jax.lax.dynamic_slice(order, (c0,), (s,)), 0)
                ln = lens[rows]
                mask = (jnp.arange(width)[None] >= width - ln[:, None]) & ok[:, None]
                res = self._model_rows(
                    model, kv, ids[rows][:, p - width :], mask, jnp.where(ok, adapter[rows], -1), keys[rows], ok
                )
                dst = jnp.where(ok, rows, r)  # out of range: dropped
                return tuple(o.at[dst].set(v.astype(o.dtype), mode="drop") for o, v in zip(out, res))

            return run

        branches = [branch(int(s), w) for s in sizes for w in widths]

        def cond(c):
            return c[0] < nd

        def body(c):
            c0, out = c
            j = _branch_index(nd - c0, sizes, self.chunks.pad_rows)
            b = jnp.clip((lens[order[c0]] + step - 1) // step - 1, 0, n_len - 1)  # the chunk's longest prompt
            out = jax.lax.switch(j * n_len + b, branches, c0, out)
            return c0 + jnp.asarray(sizes)[j], out

        if self.cfg.mode == "choice_only":
            out0 = (jnp.zeros((r, len(self.letter_ids)), jnp.float32),)
        else:
            out0 = (jnp.full((r, m), self.pad_id, jnp.int32), jnp.zeros((r, m), bool), jnp.zeros((r,), jnp.float32))
        _, out = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), out0))
        if self.cfg.mode == "choice_only":
            letter, logp = rollout.choose_letters(out[0], n_let, keys, jnp.float32(self.cfg.temperature))
            reason = jnp.where(n_let > 0, REASON_OK, REASON_INVALID).astype(jnp.int32)
            letter = jnp.where(n_let > 0, letter, -1).astype(jnp.int32)
            resp = jnp.asarray(self.letter_ids)[jnp.maximum(letter, 0)][:, None]
            return letter, reason, logp, resp, jnp.ones_like(resp, bool)
        tokens, mask, logp = out
        reason, letter = jax.vmap(lambda t, mk, nl: parse_device.parse_tokens(self.byte_table, t, mk, nl))(
            tokens, mask, n_let
        )
        return letter.astype(jnp.int32), reason.astype(jnp.int32), logp, tokens, mask

    def _collect(self, base, adapters, seeds, key, reference, active, progress=False):
        lib, env, game, cfg = self.lib, self.env, self.game, self.cfg
        k, n, t_max = seeds.shape[0], self.n, self.steps
        r = k * n
        p, m, i_n = self.prompt.max_len, self.response_len, lib.num_instances
        d_max = k * n * t_max
        model = nnx.merge(self.graphdef, adapters, base)
        n_ad = model.lora_cfg.num_adapters
        # The shared system turn's K/V, once per adapter and once adapters-off (row n_ad).
        kv = model.cache_type.prefill(
            model,
            self.prompt.prefix_ids,
            jnp.concatenate([jnp.arange(n_ad, dtype=jnp.int32), jnp.full((1,), -1, jnp.int32)]),
        )
        env_keys, llm_keys = rollout.episode_keys(key, seeds)
        agents = jnp.arange(n, dtype=jnp.int32)
        adapter_of = jnp.where(reference, -1, jnp.zeros_like(agents) if cfg.shared_adapter else agents)

        if self.burnin:  # the uniform burn-in's reset key of episode s; only the active agents decide
            reset_key = lambda s: jax.random.split(jax.random.fold_in(key, s))[0]
            init_one = lambda s, a: macro.init(lib, env, reset_key(s), a, ~a.all())
            ms = jax.vmap(init_one)(seeds, active)
        else:
            init_one = lambda s: macro.init(lib, env, jax.random.PRNGKey(s), jnp.ones((n,), bool), jnp.bool_(False))
            ms = jax.vmap(init_one)(seeds)
        traj = rollout.empty_traj(k, t_max, n)
        advance = jax.vmap(macro.make_advance_to_decision(lib, env, rollout.make_traj_recorder(lib, env, t_max)))
        menu_fn = jax.vmap(
            jax.vmap(lambda s, a, kk: menus.build_menu(lib, self.guards, s, a, kk), (None, 0, 0)), (0, 0, 0)
        )
        suffix_fn = jax.vmap(jax.vmap(self.prompt.suffix, (None, 0, 0, 0, 0)), (0, 0, 0, 0, 0))
        view_lib = self.prompt.view_lib  # the game's own library (native: the NativeLibrary's base)
        label_fn = jax.vmap(
            jax.vmap(lambda s, a: prompt_ids.state_label_code(game, view_lib, s, a), (None, 0)), (0, None)
        )
        team_fn = jax.vmap(lib.team_return)
        begin_fn = jax.vmap(lambda mst, ch: macro.begin(lib, mst, ch, *macro.tables(lib, mst.env)))

        def outcomes(buf, pending, rec):
            """Writes terminated options' outcomes into their decisions (pending: int32[K, N] slot or -1)."""
            hit = rec.valid & (pending >= 0)
            dst = jnp.where(hit, pending, d_max).reshape(-1)
            buf = buf._replace(outcome=buf.outcome.at[dst].set(_rec_outcome(rec).reshape(-1), mode="drop"))
            return buf, jnp.where(hit, -1, pending)

        # The first turn of the loop only advances (nobody needs a decision yet), so the advance and the
        # decision code are each compiled once.
        carry = dict(
            ms=ms,
            traj=traj,
            need=jnp.zeros((k, n), bool),
            buf=_empty_buffers(d_max, p, m, i_n),
            pending=jnp.full((k, n), -1, jnp.int32),
            mem=prompt_ids.empty_memory((k, n)),
            ndec=jnp.zeros((k, n), jnp.int32),
            counts=jnp.zeros((len(parse_device.REASON_CODES),), jnp.int32),
            model_rows=jnp.zeros((), jnp.int32),
            wave=jnp.zeros((), jnp.int32),
        )
        if self.burnin:
            carry["feats"] = jnp.full((d_max, lib.num_features), -1, jnp.int32)

        def cond(c):
            return (c["wave"] == 0) | (c["need"].any() & ~c["ms"].env.done.all())

        def body(c):
            ms, buf, need, mem, ndec = c["ms"], c["buf"], c["need"], c["mem"], c["ndec"]
            dkeys = jax.vmap(
                jax.vmap(lambda s, a, dd: menus.decision_key(self.menu_seed, s, a, dd), (None, 0, 0)), (0, None, 0)
            )(seeds, agents, ndec)
            menu = menu_fn(ms.env, jnp.broadcast_to(agents, (k, n)), dkeys)
            if not self.interface.shuffle:  # native: the actions in the simulator's order, as the host loop
                menu = menu._replace(
                    letters=interfaces.unshuffled_letters(self.interface, menu.letters, menu.inst.valid, jnp)
                )
            shown = menu.letters >= 0
            n_let = shown.sum(-1).astype(jnp.int32)
            llm_row = need & active
            # choice_only: a menu of one letter (or none) has one outcome whatever the logits, so its row costs no
            # model compute (choose_letters gives letter 0 and log-prob exactly 0 from any logits, these too).
            model_row = llm_row & (n_let > 1) if cfg.mode == "choice_only" else llm_row
            ids, lens = suffix_fn(ms.env, jnp.broadcast_to(agents, (k, n)), menu.inst, menu.letters, mem)
            skeys = jax.vmap(jax.vmap(rollout.decision_sample_key, (None, 0, 0)), (0, None, 0))(llm_keys, agents, ndec)
            letter, reason, logp, resp, rmask = self._wave_llm(
                model,
                kv,
                ids.reshape(r, p),
                lens.reshape(r),
                jnp.broadcast_to(adapter_of, (k, n)).reshape(r),
                skeys.reshape(r, *skeys.shape[2:]),
                n_let.reshape(r),
                model_row.reshape(r),
            )
            letter, reason, logp = (x.reshape(k, n) for x in (letter, reason, logp))
            resp, rmask = resp.reshape(k, n, m), rmask.reshape(k, n, m)
            # The instance of the chosen letter; else the shown wait instance; else none (idle one step).
            hit = shown & (menu.letters == letter[..., None]) & (letter[..., None] >= 0)
            inst = jnp.where(hit.any(-1), jnp.argmax(hit, -1), -1)
            waits = shown & (menu.inst.opt == self.wait_id) if self.wait_id >= 0 else jnp.zeros_like(shown)
            wait_inst = jnp.where(waits.any(-1), jnp.argmax(waits, -1), -1)
            inst = jnp.where(llm_row, jnp.where(inst >= 0, inst, wait_inst), jnp.where(need, wait_inst, -1))
            choice = inst.astype(jnp.int32)
            take = lambda x: jnp.take_along_axis(x, jnp.maximum(inst, 0)[..., None], axis=-1)[..., 0]
            opt = jnp.where(inst >= 0, take(menu.inst.opt), -1)
            tgt = jnp.where(
                (inst >= 0)[..., None],
                jnp.take_along_axis(menu.inst.target, jnp.maximum(inst, 0)[..., None, None], axis=2)[:, :, 0],
                -1,
            )
            team = team_fn(ms.env)
            # Record the decisions of the LLM rows, in (rollout, agent) order.
            flat = llm_row.reshape(-1)
            slot = (buf.count + jnp.cumsum(flat) - 1).astype(jnp.int32)
            dst = jnp.where(flat, slot, d_max)
            put = lambda arr, v: arr.at[dst].set(v.reshape((r,) + v.shape[2:]).astype(arr.dtype), mode="drop")
            step_now = jnp.broadcast_to(ms.env.step[:, None], (k, n))
            buf = buf._replace(
                count=buf.count + flat.sum().astype(jnp.int32),
                rollout=put(buf.rollout, jnp.broadcast_to(jnp.arange(k)[:, None], (k, n))),
                aid=put(buf.aid, jnp.broadcast_to(agents, (k, n))),
                step=put(buf.step, step_now),
                wave=put(buf.wave, jnp.broadcast_to(c["wave"] - 1, (k, n))),
                prompt=put(buf.prompt, ids),
                prompt_len=put(buf.prompt_len, lens),
                response=put(buf.response, resp),
                response_mask=put(buf.response_mask, rmask),
                logp=put(buf.logp, logp),
                letter=put(buf.letter, letter),
                reason=put(buf.reason, reason),
                n_letters=put(buf.n_letters, n_let),
                label=put(buf.label, label_fn(ms.env, agents)),
                team=put(buf.team, jnp.broadcast_to(team[:, None], (k, n))),
                menu_opt=put(buf.menu_opt, menu.inst.opt),
                menu_target=put(buf.menu_target, menu.inst.target),
                menu_letters=put(buf.menu_letters, menu.letters),
                inst=put(buf.inst, inst),
                option=put(buf.option, opt),
                target=put(buf.target, tgt),
                outcome=put(buf.outcome, jnp.where(inst >= 0, OUTCOME_RUNNING, OUTCOME_IDLE)),
            )
            counts = c["counts"] + jnp.zeros_like(c["counts"]).at[reason.reshape(-1)].add(flat.astype(jnp.int32))
            pending = jnp.where(llm_row, slot.reshape(k, n), c["pending"])
            code = jnp.where(opt >= 0, opt, self.idle_code).astype(jnp.int32)
            new_mem = jax.vmap(jax.vmap(prompt_ids.remember))(mem, code, jnp.broadcast_to(team[:, None], (k, n)))
            mem = jax.tree.map(
                lambda a, b: jnp.where(llm_row.reshape(llm_row.shape + (1,) * (a.ndim - 2)), a, b), new_mem, mem
            )
            ndec = ndec + llm_row.astype(jnp.int32)
            model_rows = c["model_rows"] + model_row.sum().astype(jnp.int32)
            ms, rec_fail = begin_fn(ms, choice)
            buf, pending = outcomes(buf, pending, rec_fail)
            # Agents left without an option (parse failure, no wait option) or whose option failed at its start
            # idle for one step (jaxopt_marl.rollout's docstring, step 4): at most one decision per agent per env step.
            idle_now = ((choice < 0) & need) | rec_fail.valid
            extra = {}
            if self.burnin:
                # The chosen instance's features at initiation: begin() keeps them in ms.feats for a started
                # option and in rec_fail.feats for one that failed at its start.
                chosen = jnp.where(rec_fail.valid[..., None], rec_fail.feats, ms.feats)
                chosen = jnp.where((inst >= 0)[..., None], chosen, -1)
                extra["feats"] = c["feats"].at[dst].set(chosen.reshape(r, -1), mode="drop")
            force = idle_now.any(axis=1)
            ms, traj, need, rec = advance(ms, env_keys, force, c["traj"])
            buf, pending = outcomes(buf, pending, rec)
            if progress:  # the slowest episode's env step (steps), once the wave is played
                progress_lib.reach(jnp.where(ms.env.done, t_max, ms.env.step).min())
            return dict(
                ms=ms,
                traj=traj,
                need=need,
                buf=buf,
                pending=pending,
                mem=mem,
                ndec=ndec,
                counts=counts,
                model_rows=model_rows,
                wave=c["wave"] + 1,
                **extra,
            )

        c = jax.lax.while_loop(cond, body, carry)
        buf = c["buf"]
        # Options still running when the episode ended.
        buf = buf._replace(outcome=jnp.where(buf.outcome == OUTCOME_RUNNING, OUTCOME_EPISODE_END, buf.outcome))
        stats = jax.vmap(lambda s: {**env.world_stats(s), "team_return": lib.team_return(s)})(c["ms"].env)
        return CompiledResult(
            decisions=buf,
            traj=c["traj"],
            stats=stats,
            parse_counts=c["counts"],
            waves=c["wave"] - 1,
            feats=c.get("feats"),
            model_rows=c["model_rows"],
        )

    # -- host side --------------------------------------------------------------------------------------

    def device_args(self, seeds, key, reference: bool = False, active=None):
        """The jitted program's arguments, placed on the device (so a call needs no implicit transfer).

        Raises:
            ValueError: ``len(seeds)`` is not K, or ``active`` is not bool[N] or bool[K, N].
        """
        seeds = np.asarray(seeds, np.int32)
        if seeds.shape != (self.batch,):
            raise ValueError(
                f"{self.game}: this roller plays K={self.batch} rollouts per call, got {seeds.shape[0]} seeds"
            )
        act = np.ones((self.batch, self.n), bool) if active is None else np.asarray(active, bool)
        if act.shape == (self.n,):
            act = np.broadcast_to(act, (self.batch, self.n))
        if act.shape != (self.batch, self.n):
            raise ValueError(f"active must be bool[{self.n}] or bool[{self.batch}, {self.n}], got {act.shape}")
        return jax.device_put((seeds, key, np.bool_(reference), np.ascontiguousarray(act)), self._device)

    def run(
        self, adapters, base, seeds, key, reference: bool = False, active=None, progress: bool = False
    ) -> CompiledResult:
        """One compiled call: K episodes on ``seeds`` (device outputs; nothing is copied to the host).
        ``progress``: the program variant that reports the slowest episode's env step after every wave to the
        bar routed by :func:`jaxopt_marl.progress.route` (same outputs bit for bit; one host callback per
        wave)."""
        seeds, key, ref, act = self.device_args(seeds, key, reference, active)
        # One placement for the weights whatever produced them (the update returns mesh-replicated arrays):
        # a different sharding would be a new jit signature, i.e. a recompile every round.
        base, adapters = jax.device_put((base, adapters), self._device)
        return (self._fn_progress if progress else self._fn)(base, adapters, seeds, key, ref, act)

    def collect(
        self,
        seeds,
        key,
        *,
        adapters=None,
        base=None,
        round_idx: int = 0,
        reference: bool = False,
        active=None,
        progress: bool = False,
        desc: str = "rollouts",
    ) -> rollout.RolloutResult:
        """Plays ``len(seeds)`` episodes in calls of K and decodes them like :meth:`jaxopt_marl.rollout.Roller.collect`.

        ``len(seeds)`` need not be K: the seeds are played in batches of K (the last one padded with repeats of
        its last seed, whose results are dropped); every episode's draws come from its own seed's keys, so the
        batching does not change any episode. ``adapters``/``base`` default to the model's current values.
        ``active`` is bool[N] (the same agents in every episode) or bool[len(seeds), N]. ``progress``: a tqdm bar
        (``desc``) in env steps of the slowest episode of each call, moved after every decision wave from inside
        the compiled program (:meth:`run`); its total is steps x calls.

        Returns:
            :class:`jaxopt_marl.rollout.RolloutResult` with host traces and trajectories; its ``device`` holds
            the :class:`CompiledResult` of each call (for :func:`decision_batch`).
        """
        from lora import split_model

        t0 = time.perf_counter()
        if adapters is None or base is None:
            _, ad, bs = split_model(self.model)
            adapters = ad if adapters is None else adapters
            base = bs if base is None else base
        seeds = [int(s) for s in seeds]
        act = np.ones((len(seeds), self.n), bool) if active is None else np.asarray(active, bool)
        if act.shape == (self.n,):
            act = np.broadcast_to(act, (len(seeds), self.n))
        if act.shape != (len(seeds), self.n):
            raise ValueError(f"active must be bool[{self.n}] or bool[{len(seeds)}, {self.n}], got {act.shape}")
        outs, batches = [], []
        starts = range(0, len(seeds), self.batch)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(starts) * self.steps, desc=desc, unit="step", leave=False)
        with progress_lib.route(bar):
            for call, j in enumerate(starts):
                ss = seeds[j : j + self.batch]
                aa = act[j : j + self.batch]
                pad = self.batch - len(ss)
                ss = ss + [ss[-1]] * pad
                aa = np.concatenate([aa, np.repeat(aa[-1:], pad, 0)]) if pad else aa
                progress_lib.set_offset(call * self.steps)
                outs.append(self.run(adapters, base, ss, key, reference, aa, progress=bar is not None))
                batches.append(len(ss) - pad)
                if bar is not None:  # every callback of this call delivered before the offset moves
                    jax.block_until_ready(outs[-1])
                    jax.effects_barrier()
        if bar is not None:
            bar.close()
        host = [jax.device_get(o) for o in outs]
        seconds = time.perf_counter() - t0
        return self._result(host, batches, outs, seeds, round_idx, reference, seconds)

    def _result(self, host, batches, outs, seeds, round_idx, reference, seconds) -> rollout.RolloutResult:
        traces, parse = [], parsing.ParseStats()
        traj, stats = {}, {}
        mismatch = 0
        for j, (h, nb) in enumerate(zip(host, batches)):
            off = j * self.batch
            tr, mm = self.traces(h.decisions, seeds[off : off + nb], round_idx, reference, rollout_offset=off, keep=nb)
            traces += tr
            mismatch += mm
            for key, v in h.traj.items():
                traj.setdefault(key, []).append(np.asarray(v)[:nb])
            for key, v in h.stats.items():
                stats.setdefault(key, []).append(np.asarray(v)[:nb])
        for t in traces:
            parse.counts[t["parse"]] += 1
        traj = {key: np.concatenate(v) for key, v in traj.items()}
        stats = {key: np.concatenate(v) for key, v in stats.items()}
        return rollout.RolloutResult(
            returns=stats["team_return"].astype(np.float32),
            decisions=[],
            traces=traces,
            parse=parse,
            traj=traj,
            stats=stats,
            seconds=seconds,
            llm_seconds=float("nan"),
            device=outs,
            batches=batches,
            parse_mismatch=mismatch,
            waves=int(sum(int(h.waves) for h in host)),
            model_rows=int(sum(int(h.model_rows) for h in host)),
        )

    def traces(
        self,
        dec: DecisionBuffers,
        seeds,
        round_idx: int,
        reference: bool,
        rollout_offset: int = 0,
        keep: int | None = None,
    ) -> tuple[list[dict], int]:
        """The JSON traces of one call's decisions (host copies of :class:`DecisionBuffers`).

        Each record has today's fields (round, rollout, seed, step, aid, prompt = the user message, menu lines,
        response, choice, parse, parse_fail, option, target (x, y), outcome, logp, reference) plus
        ``response_source`` (``template`` in ``choice_only`` mode, whose ``response`` the rollout formats from the
        scored letter and state label, ``model`` for sampled text; :data:`jaxopt_marl.artifacts.RESPONSE_SOURCES`),
        ``prompt_text`` (the full rendered chat string the model was given), ``prompt_ids`` (its token ids,
        system turn included, no padding), ``response_ids``, ``wave`` and ``n_letters``. Rollouts ``>= keep``
        (batch padding) are dropped.

        Returns:
            ``(traces, mismatches)``: mismatches counts sampled responses whose host parse
            (:func:`jaxopt_marl.parsing.parse_response` of the decoded text) differs from the device's.
        """
        lib, tok = self.lib, self.tok
        count = int(dec.count)
        if count > dec.prompt.shape[0]:  # cannot happen (one decision per agent per env step); never drop silently
            raise RuntimeError(
                f"{self.game}: {count} decisions overflowed the rollout's decision buffers of "
                f"{dec.prompt.shape[0]} (K x N x T)"
            )
        keep = self.batch if keep is None else keep
        fam = prompts.family(self.game)
        labels = prompts.STATE_LABELS[fam]
        prefix = list(self.prompt.prefix_ids)
        eos = set(self.eos_ids)
        out, mismatch = [], 0
        for d in range(count):
            b = int(dec.rollout[d])
            if b >= keep:
                continue
            pl = int(dec.prompt_len[d])
            suffix_ids = [int(x) for x in dec.prompt[d, dec.prompt.shape[1] - pl :]]
            suffix_text = tok.decode(suffix_ids, skip_special_tokens=False)
            user = suffix_text[len(self._user_head) :]
            user = user[: user.index(self._user_tail)] if self._user_tail in user else user
            resp_ids = [int(x) for x, ok in zip(dec.response[d], dec.response_mask[d]) if ok]
            n_l = int(dec.n_letters[d])
            reason = parse_device.REASON_CODES[int(dec.reason[d])]
            letter = int(dec.letter[d])
            if self.cfg.mode == "choice_only":
                response = f"state: {labels[int(dec.label[d])]}\nchoice: {menus.LETTERS[max(letter, 0)]}"
            else:
                response = tok.decode([x for x in resp_ids if x not in eos], skip_special_tokens=True)
                host = parsing.parse_response(response, menus.LETTERS[:n_l])
                if host.reason != reason or (host.ok and menus.LETTERS.index(host.letter) != letter):
                    mismatch += 1
            inst = int(dec.inst[d])
            opt = int(dec.option[d])
            tgt = dec.target[d]
            o = int(dec.outcome[d])
            outcome = {
                OUTCOME_RUNNING: "running",
                OUTCOME_EPISODE_END: "episode_end",
                OUTCOME_IDLE: "idle",
                OUTCOME_SUCCESS: "success",
                OUTCOME_EFFECT_FAIL: "effect_fail",
            }.get(o)
            if outcome is None:
                outcome = f"explicit:{lib.reasons[o - OUTCOME_EXPLICIT_BASE]}"
            menu_text = menus.render_menu(lib, dec.menu_opt[d], dec.menu_target[d], dec.menu_letters[d])
            out.append(
                dict(
                    round=int(round_idx),
                    rollout=b + rollout_offset,
                    seed=int(seeds[b]),
                    step=int(dec.step[d]),
                    aid=int(dec.aid[d]),
                    interface=self.cfg.interface,
                    prompt=user,
                    menu=menu_text.split("\n")[1:],
                    response=response,
                    response_source="template" if self.cfg.mode == "choice_only" else "model",
                    choice=menus.LETTERS[letter] if reason == parsing.OK else None,
                    parse=reason,
                    parse_fail=reason != parsing.OK,
                    option=lib.option_names[opt] if opt >= 0 else "idle",
                    target=None if tgt[0] < 0 or inst < 0 else [int(tgt[1]), int(tgt[0])],
                    outcome=outcome,
                    logp=float(dec.logp[d]),
                    reference=bool(reference),
                    wave=int(dec.wave[d]),
                    n_letters=n_l,
                    prompt_text=self.prompt.prefix_text + suffix_text,
                    prompt_ids=prefix + suffix_ids,
                    response_ids=resp_ids,
                )
            )
        return out, mismatch

    # -- replay (GIFs) ----------------------------------------------------------------------------------

    def replay_frames(self, seed: int, key, actions: np.ndarray) -> np.ndarray:
        """``uint8[T, H, W, 3]``: the episode of ``seed`` re-played from its recorded primitive actions
        (``traj["actions"][k]``, int32[T, N]) with the same env keys, rendered after every step; frames after
        the episode's end repeat the last one. Exactly the evaluated episode, not a fresh sample."""
        return self.replay_view(seed, key, actions, self.env.render, "frames")

    def replay_view(self, seed: int, key, actions: np.ndarray, view, name: str) -> np.ndarray:
        """``view(state)`` after every step of the episode of ``seed`` re-played from its recorded primitive
        actions (int32[T, N]) with the same env keys (as :meth:`replay_frames`), stacked on a leading T axis
        (after the end: the last state's). ``view`` is a JAX function of the env state returning an array or a
        pytree of arrays (e.g. the live-apple grid ``lambda s: s.apples``), returned as NumPy arrays; ``name``
        keys its compiled program (one per view). :func:`jaxopt_marl.rollout.replay_view`."""
        return rollout.replay_view(self.env, self._replay, seed, key, actions, view, name)


# ---------------------------------------------------------------------------------------------------------
# The PA-MAGRPO batch, built on the device
# ---------------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("rows", "width", "mode", "pad_id"))
def _batch(dec: DecisionBuffers, adv, letter_ids, *, rows: int, width: int, mode: str, pad_id: int):
    p = dec.prompt.shape[1]
    d = jnp.arange(rows)
    valid = d < dec.count
    take = lambda x: x[:rows]
    prompt = take(dec.prompt)[:, p - width :]
    plen = jnp.minimum(take(dec.prompt_len), width)
    pmask = (jnp.arange(width)[None] >= width - plen[:, None]) & valid[:, None]
    resp = take(dec.response)
    rmask = take(dec.response_mask) & valid[:, None]
    resp = jnp.where(rmask, resp, pad_id)
    tokens = jnp.where(jnp.concatenate([pmask, rmask], 1), jnp.concatenate([prompt, resp], 1), pad_id)
    attn = jnp.concatenate([pmask, rmask], 1)
    rm = jnp.concatenate([jnp.zeros_like(pmask), rmask], 1)
    choice_ids = None
    if mode == "choice_only":
        n = take(dec.n_letters)
        c = jnp.where(jnp.arange(letter_ids.shape[0])[None] < n[:, None], letter_ids[None], -1)
        # Padding rows: their (pad) response token is the one candidate, as pack_decisions does.
        c = jnp.where(valid[:, None], c, jnp.full_like(c, -1).at[:, 0].set(pad_id))
        choice_ids = c.astype(jnp.int32)
    return DecisionBatch(
        tokens=tokens.astype(jnp.int32),
        attention_mask=attn,
        response_mask=rm,
        agent_ids=jnp.where(valid, take(dec.aid), 0).astype(jnp.int32),
        advantages=jnp.where(valid, adv[take(dec.rollout)], 0.0).astype(jnp.float32),
        logp_old=jnp.zeros((rows,), jnp.float32),
        logp_ref=jnp.zeros((rows,), jnp.float32),
        valid=valid,
        choice_ids=choice_ids,
    )


def decision_batch(
    roller: CompiledRoller,
    res: rollout.RolloutResult,
    adv: np.ndarray,
    *,
    row_multiple: int,
    prefix: tuple[int, ...],
    width_step: int = 64,
    row_bucket: int = 64,
) -> DecisionBatch:
    """The round's PA-MAGRPO batch from the compiled rollout's device buffers (no per-decision host work).

    Rows ``[prompt (left-padded to the round's longest, rounded up to width_step) | response]``; D rounded up to
    a multiple of ``row_bucket`` and ``row_multiple`` (devices x minibatches x micro-batch), padding rows
    invalid. Only two scalars per call cross to the host (the decision count and the longest prompt), to pick
    the static shapes.

    Args:
        roller: the roller that played ``res``.
        res: its :class:`jaxopt_marl.rollout.RolloutResult` (one call of K rollouts: ``res.device[0]``).
        adv: float32[K] group-relative advantage per rollout.
        row_multiple: D must be a multiple of this.
        prefix: the shared system-turn ids (``DecisionBatch.prefix``).
        width_step, row_bucket: shape buckets (fewer distinct shapes = fewer compiles of the update).

    Raises:
        ValueError: ``res`` came from more than one call.
    """
    if len(res.device) != 1:
        raise ValueError(f"a training batch comes from one call of K rollouts, got {len(res.device)} calls")
    dec = res.device[0].decisions
    count = int(dec.count)
    longest = int(jnp.max(jnp.where(jnp.arange(dec.prompt_len.shape[0]) < count, dec.prompt_len, 0)))
    p = dec.prompt.shape[1]
    width = min(p, max(width_step, -(-longest // width_step) * width_step))
    mult = int(np.lcm(row_bucket, max(1, row_multiple)))
    rows = max(mult, -(-count // mult) * mult)
    if rows > dec.prompt.shape[0]:  # the buffer is smaller than the bucket: pad it (rare; tiny episodes)
        extra = rows - dec.prompt.shape[0]
        dec = jax.tree.map(
            lambda x: x if x.ndim == 0 else jnp.concatenate([x, jnp.zeros((extra,) + x.shape[1:], x.dtype)]), dec
        )
    batch = _batch(
        dec,
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(roller.letter_ids),
        rows=rows,
        width=width,
        mode=roller.cfg.mode,
        pad_id=roller.pad_id,
    )
    return batch.replace(response_len=roller.response_len, prefix=tuple(int(x) for x in prefix))


__all__ = [
    "ChunkConfig",
    "CompiledResult",
    "CompiledRoller",
    "DecisionBuffers",
    "OUTCOME_EPISODE_END",
    "OUTCOME_IDLE",
    "OUTCOME_RUNNING",
    "decision_batch",
]
