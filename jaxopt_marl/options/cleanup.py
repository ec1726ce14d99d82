"""Clean Up option library (paper §5.1; the menu of its Cleanup example: "eat apple @ (2, 11) / clean dirt @
(4, 5) / go to the river / go to the grass/orchard").

Vocabulary (executor kinds and shared rules: :mod:`jaxopt_marl.options.meltingpot_common`):

=================  ============================  ================  ===========  ========================================
option             menu label                    target class      kind         read set
=================  ============================  ================  ===========  ========================================
``eat_apple``      ``eat apple @ (x, y)``        apple (cap 6)     walk_onto    tgt_apple, region
``clean_dirt``     ``clean dirt @ (x, y)``       dirt (cap 6)      beam         tgt_dirty, clean_ready, region
``go_to_river``    ``go to the river``           none              region       region, dirt_level
``go_to_orchard``  ``go to the grass/orchard``   none              region       region, dirt_level
``wait``           ``wait``                      none              wait         (none)
=================  ============================  ================  ===========  ========================================

Instantiation: apples and dirt are capped at :data:`~jaxopt_marl.options.meltingpot_common.TARGET_CAP` (6)
instances each -- the nearest *visible* ones (the agent's 11x11 window: 9 ahead, 1 behind, 5 to each side) by
static path distance; the region moves and ``wait`` have one instance each (target -1, label without
coordinates as in the paper's menu).

Regions (static, from the map legend of ``envs_jax.cleanup``):
    - *river*: the 147 dirt-capable river cells (``F``/``H``: rows 1-5 and row 6, cols 17-23) -- where dirt can
      be and cleaning happens; the never-dirty channel (``S``, ``~``) is not part of it. ``go to the river``
      walks to the nearest river cell and turns to face north (into the river), so the river is in view.
    - *orchard* ("grass/orchard"): the 122 apple-capable cells (``B``/``T``, rows 15-19). ``go to the
      grass/orchard`` walks to the nearest orchard cell and faces south (into the orchard).
    - *bank*: every other walkable cell (sand, spawn points, the channel).

Read-set features (deterministic only, §5.1 Stage 2):
    - ``tgt_apple``: the target cell holds an apple (``yes``/``no``; ``NA`` for non-apple targets).
    - ``tgt_dirty``: the target cell is dirty (``yes``/``no``; ``NA`` for non-dirt targets).
    - ``clean_ready``: the cleaning beam is off cooldown (``clean_cooldown == 0``).
    - ``region``: the acting agent's region (``river``/``bank``/``orchard``).
    - ``dirt_level``: river dirt fraction d = dirty / 147: ``low`` (d < 0.2), ``mid`` (0.2 <= d < 0.4),
      ``high`` (d >= 0.4: no apple can grow, spec §1.3).
    Transient multi-agent facts (partners' positions, zaps) are not features.

Effect predicates (delta form, bound to a private transition of the acting agent; §5.1 Defects 1-2):
    - ``eat_apple``: the target held an apple at initiation, and at termination the agent stands on the
      target, ate this step (``ate > 0``) and its ``apples_total`` rose. An apple eaten by a partner is never
      credited (the agent did not eat); an apple eaten en route elsewhere is not the promised one.
    - ``clean_dirt``: the *target* went dirty -> clean (the name promises the target, not any cell), and this
      agent's beam fired in the final step (``clean_fired``), its ``cleaned`` count rose, and the target is
      the first cell of one of its beam segments (adjacent, not behind). A target cleaned by a partner first
      ends the option (the executor abandons) as ``effect_fail``.
    - ``go_to_river`` / ``go_to_orchard``: the agent was outside the region at initiation and is inside at
      termination (already there -> ``effect_fail``).
    - ``wait``: always true.

Zap: not in the vocabulary (the paper's Cleanup menu has no zap option; zapping removes a teammate for 50
steps and is never needed to eat or clean). Removed agents: a running option ends at the agent's next step
as ``effect_fail`` (see the common module), and the agent does not decide until it respawns.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from envs_jax import cleanup as cu
from envs_jax import meltingpot as mp
from jaxopt_marl import paths
from jaxopt_marl.options.base import NA, NO_TARGET, FeatureSpec
from jaxopt_marl.options.meltingpot_common import (
    KIND_BEAM,
    KIND_REGION,
    KIND_WAIT,
    KIND_WALK_ONTO,
    TARGET_CAP,
    WAIT_STEPS,
    MeltingPotOptions,
    check_target_cap,
    check_wait_steps,
    option_specs,
)

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

YES_NO_NA = ("no", "yes", NA)
REGION_VALUES = ("river", "bank", "orchard")
R_RIVER, R_BANK, R_ORCHARD = range(3)
DIRT_LEVEL_VALUES = ("low", "mid", "high")
#: Dirt-fraction bucket edges: below 0.2 ``low``; below 0.4 (= thresholdDepletion, spec §1.3) ``mid``.
DIRT_LEVEL_EDGES = (0.2, cu.THRESHOLD_DEPLETION)

FEATURES = (
    FeatureSpec("tgt_apple", YES_NO_NA),
    FeatureSpec("tgt_dirty", YES_NO_NA),
    FeatureSpec("clean_ready", ("no", "yes")),
    FeatureSpec("region", REGION_VALUES),
    FeatureSpec("dirt_level", DIRT_LEVEL_VALUES),
)
F_TGT_APPLE, F_TGT_DIRTY, F_CLEAN_READY, F_REGION, F_DIRT_LEVEL = range(len(FEATURES))
V_NO, V_YES, V_NA = range(3)

_VISIBLE = "one instance per visible {}, capped at the {{cap}} nearest by path distance"
# name, label, target class, kind, read set, instantiation, effect
_OPTIONS = (
    (
        "eat_apple",
        "eat apple @ ({x}, {y})",
        "apple",
        KIND_WALK_ONTO,
        ("tgt_apple", "region"),
        _VISIBLE.format("apple"),
        "pre tgt_apple and post: on the target, ate > 0 this step and apples_total increased",
    ),
    (
        "clean_dirt",
        "clean dirt @ ({x}, {y})",
        "dirt",
        KIND_BEAM,
        ("tgt_dirty", "clean_ready", "region"),
        _VISIBLE.format("dirty river cell"),
        "pre tgt_dirty and post not tgt_dirty, this agent's beam fired in the last step with cleaned > 0, and the "
        "target is the first cell of one of its beam segments",
    ),
    (
        "go_to_river",
        "go to the river",
        NO_TARGET,
        KIND_REGION,
        ("region", "dirt_level"),
        "always one instance",
        "pre region != river and post region == river",
    ),
    (
        "go_to_orchard",
        "go to the grass/orchard",
        NO_TARGET,
        KIND_REGION,
        ("region", "dirt_level"),
        "always one instance",
        "pre region != orchard and post region == orchard",
    ),
    ("wait", "wait", NO_TARGET, KIND_WAIT, (), "always one instance", "always true"),
)
EAT_APPLE, CLEAN_DIRT, GO_TO_RIVER, GO_TO_ORCHARD, WAIT = range(len(_OPTIONS))
_REGION_TEXT = {
    GO_TO_RIVER: "the river (dirt-capable cells), facing north",
    GO_TO_ORCHARD: "the orchard (apple-capable cells), facing south",
}


# ---------------------------------------------------------------------------------------------------------
# Library
# ---------------------------------------------------------------------------------------------------------


class CleanupOptions(MeltingPotOptions):
    """Option library of Clean Up (see the module docstring).

    Args:
        env: an ``envs_jax.cleanup.Cleanup`` (the real map or a test ``ascii_map``).
        target_cap: instances per apple / dirt class (default :data:`TARGET_CAP`).
        wait_steps: NOOPs of the ``wait`` option (default :data:`~jaxopt_marl.options.meltingpot_common.WAIT_STEPS`).
    """

    feature_specs = FEATURES

    def __init__(self, env, target_cap: int = TARGET_CAP, wait_steps: int = WAIT_STEPS):
        check_target_cap(target_cap)
        check_wait_steps(wait_steps)
        self.wait_steps = int(wait_steps)
        options = option_specs(
            _OPTIONS,
            {"apple": target_cap, "dirt": target_cap},
            [_REGION_TEXT.get(i, "") for i in range(len(_OPTIONS))],
            wait_steps,
        )
        river = np.asarray(env.dirt_capable, bool)
        orchard = np.asarray(env.apple_capable, bool)
        regions = np.stack([river, orchard])
        face = np.stack([np.full(river.shape, mp.NORTH), np.full(river.shape, mp.SOUTH)]).astype(np.int32)
        self._setup(
            env,
            options,
            tuple(o[3] for o in _OPTIONS),
            regions,
            face,
            opt_region=(-1, -1, 0, 1, -1),
            cell_region=None,
            static_targets={},
        )
        self.game = "cleanup"
        self.num_dirt_cells = int(env.num_dirt_cells)
        region_map = np.full(river.shape, R_BANK, np.int32)
        region_map[river] = R_RIVER
        region_map[orchard] = R_ORCHARD
        self.region_map = region_map

    # -- hooks -------------------------------------------------------------------------------------------

    def object_grid(self, state, target_class: str):
        return state.apples if target_class == "apple" else state.dirt

    def _cooldown(self, state, aid):
        return state.clean_cooldown[aid]

    # -- read set ----------------------------------------------------------------------------------------

    def _dirt_level(self, state):
        d = jnp.sum(state.dirt) / self.num_dirt_cells
        return (d >= DIRT_LEVEL_EDGES[0]).astype(jnp.int32) + (d >= DIRT_LEVEL_EDGES[1]).astype(jnp.int32)

    def features(self, state, aid, inst):
        opt, target = inst.opt, inst.target
        has = target[:, 0] >= 0
        apple = jnp.where(self._at(state.apples, target), V_YES, V_NO)
        dirty = jnp.where(self._at(state.dirt, target), V_YES, V_NO)
        tgt_apple = jnp.where(has & (opt == EAT_APPLE), apple, V_NA)
        tgt_dirty = jnp.where(has & (opt == CLEAN_DIRT), dirty, V_NA)
        n = opt.shape[0]
        ready = jnp.broadcast_to((state.clean_cooldown[aid] == 0).astype(jnp.int32), (n,))
        region = jnp.broadcast_to(jnp.asarray(self.region_map)[state.pos[aid, 0], state.pos[aid, 1]], (n,))
        level = jnp.broadcast_to(self._dirt_level(state), (n,))
        return jnp.stack([tgt_apple, tgt_dirty, ready, region, level], -1).astype(jnp.int32)

    # -- effect predicates -------------------------------------------------------------------------------

    def snapshot(self, state, aid, target):
        pos, facing = state.pos[aid], state.facing[aid]
        adjacent = jnp.abs(target - pos).sum() == 1
        behind = facing == paths.facing_toward(target, pos)  # facing away from the target
        return {
            "ate": state.ate[aid],
            "apples_total": state.apples_total[aid],
            "cleaned": state.cleaned[aid],
            "cleaned_total": state.cleaned_total[aid],
            "clean_fired": state.clean_fired[aid],
            "on_target": jnp.all(pos == target),
            "beam_reaches": adjacent & (target[0] >= 0) & ~behind,
            "tgt_apple": self._at(state.apples, target),
            "tgt_dirty": self._at(state.dirt, target),
            "in_river": self.region_cell(state, aid, 0),
            "in_orchard": self.region_cell(state, aid, 1),
        }

    def effect(self, opt, pre, post):
        eat = pre["tgt_apple"] & post["on_target"] & (post["ate"] > 0) & (post["apples_total"] > pre["apples_total"])
        clean = (
            pre["tgt_dirty"]
            & ~post["tgt_dirty"]
            & post["clean_fired"]
            & (post["cleaned"] > 0)
            & (post["cleaned_total"] > pre["cleaned_total"])
            & post["beam_reaches"]
        )
        river = ~pre["in_river"] & post["in_river"]
        orchard = ~pre["in_orchard"] & post["in_orchard"]
        return jnp.stack([eat, clean, river, orchard, jnp.array(True)])[opt]


def make_library(env, **config) -> CleanupOptions:
    """Registry factory (``jaxopt_marl.options.get_library("cleanup")``)."""
    return CleanupOptions(env, **config)


__all__ = ["FEATURES", "CleanupOptions", "make_library"]
