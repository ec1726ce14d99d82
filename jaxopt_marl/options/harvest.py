"""Commons Harvest (Open) option library (paper §5.1, the Cleanup template with Harvest's sections swapped).

Vocabulary (executor kinds and shared rules: :mod:`jaxopt_marl.options.meltingpot_common`):

===============  =========================  ===============  ==========  ==============================================
option           menu label                 target class     kind        read set
===============  =========================  ===============  ==========  ==============================================
``eat_apple``    ``eat apple @ (x, y)``     apple (cap 6)    walk_onto   tgt_apple, in_tgt_patch, tgt_patch_apples
``go_to_patch``  ``go to patch @ (x, y)``   patch (6)        region      in_tgt_patch, tgt_patch_apples
``wait``         ``wait``                   none             wait        (none)
===============  =========================  ===============  ==========  ==============================================

Instantiation: apples are capped at :data:`~jaxopt_marl.options.meltingpot_common.TARGET_CAP` (6) instances --
the nearest *visible* apples (the agent's 11x11 window) by static path distance; ``go_to_patch`` has one
instance per apple patch (the map's 6 connected groups of apple cells, ``envs_jax.harvest.label_patches``),
always shown (a patch is a region; whether it still holds apples is a feature, not an instantiation rule); its
target -- the coordinates in the label -- is the patch cell nearest the patch's centroid (P2's diamond centre
(3, 8) is ``go to patch @ (8, 3)``). ``wait`` has one instance.

``go_to_patch`` walks to the nearest cell of the target patch and turns to face the patch centroid from there
(so the patch lies in the view window).

Read-set features (deterministic only):
    - ``tgt_apple``: the target cell holds an apple (``yes``/``no``; ``NA`` for ``go_to_patch`` / ``wait``).
    - ``in_tgt_patch``: the agent stands in the patch of the target (``yes``/``no``; ``NA`` for ``wait``).
    - ``tgt_patch_apples``: live apples in the target's patch: ``none`` (0), ``one`` (1, e.g. the last apple:
      eating it extinguishes the patch for good, spec §2.3), ``few`` (2-3), ``many`` (>= 4); ``NA`` for ``wait``.

Effect predicates (delta form, private transition of the acting agent):
    - ``eat_apple``: the target held an apple at initiation, and at termination the agent stands on the target,
      ate this step and its ``apples_total`` rose (a partner eating the target is never credited).
    - ``go_to_patch``: the agent was outside the target patch at initiation and is inside at termination.
    - ``wait``: always true.

Zap: not in the vocabulary (the paper's Harvest results need no zapping: restraint is about *not eating* the
last apples; a zap option would add a purely competitive action the vocabulary of §5.1 does not list). A
removed agent's running option ends at its next step as ``effect_fail``; it decides again after respawning.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxopt_marl.options.base import NA, NO_TARGET, FeatureSpec
from jaxopt_marl.options.meltingpot_common import (
    KIND_REGION,
    KIND_WAIT,
    KIND_WALK_ONTO,
    TARGET_CAP,
    WAIT_STEPS,
    MeltingPotOptions,
    check_target_cap,
    check_wait_steps,
    compass_toward,
    option_specs,
)

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

YES_NO_NA = ("no", "yes", NA)
PATCH_APPLES_VALUES = ("none", "one", "few", "many", NA)
#: Upper bounds (inclusive) of the ``none``/``one``/``few`` buckets of ``tgt_patch_apples``; above: ``many``.
PATCH_APPLES_EDGES = (0, 1, 3)

FEATURES = (
    FeatureSpec("tgt_apple", YES_NO_NA),
    FeatureSpec("in_tgt_patch", YES_NO_NA),
    FeatureSpec("tgt_patch_apples", PATCH_APPLES_VALUES),
)
V_NO, V_YES, V_NA = range(3)
PA_NA = len(PATCH_APPLES_VALUES) - 1

# name, label, target class, kind, read set, instantiation, effect
_OPTIONS = (
    (
        "eat_apple",
        "eat apple @ ({x}, {y})",
        "apple",
        KIND_WALK_ONTO,
        ("tgt_apple", "in_tgt_patch", "tgt_patch_apples"),
        "one instance per visible apple, capped at the {cap} nearest by path distance",
        "pre tgt_apple and post: on the target, ate > 0 this step and apples_total increased",
    ),
    (
        "go_to_patch",
        "go to patch @ ({x}, {y})",
        "patch",
        KIND_REGION,
        ("in_tgt_patch", "tgt_patch_apples"),
        "one instance per apple patch (target: the patch cell nearest its centroid)",
        "pre not in the target patch and post in the target patch",
    ),
    ("wait", "wait", NO_TARGET, KIND_WAIT, (), "always one instance", "always true"),
)
EAT_APPLE, GO_TO_PATCH, WAIT = range(len(_OPTIONS))


def patch_targets(patch_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per patch: ``(target int32[P, 2]`` = the cell nearest the centroid (ties row-major), ``centroid
    float[P, 2])``."""
    targets, cents = [], []
    for p in range(int(patch_id.max()) + 1):
        cells = np.argwhere(patch_id == p)
        c = cells.mean(0)
        targets.append(cells[np.argmin(((cells - c) ** 2).sum(1))])
        cents.append(c)
    return np.asarray(targets, np.int32).reshape(-1, 2), np.asarray(cents, float).reshape(-1, 2)


# ---------------------------------------------------------------------------------------------------------
# Library
# ---------------------------------------------------------------------------------------------------------


class HarvestOptions(MeltingPotOptions):
    """Option library of Commons Harvest (see the module docstring).

    Args:
        env: an ``envs_jax.harvest.CommonsHarvest`` (the real map or a test ``ascii_map``).
        target_cap: apple instances (default :data:`TARGET_CAP`).
        wait_steps: NOOPs of the ``wait`` option (default :data:`~jaxopt_marl.options.meltingpot_common.WAIT_STEPS`).
    """

    feature_specs = FEATURES

    def __init__(self, env, target_cap: int = TARGET_CAP, wait_steps: int = WAIT_STEPS):
        check_target_cap(target_cap)
        check_wait_steps(wait_steps)
        self.wait_steps = int(wait_steps)
        patch_id = np.asarray(env.patch_id, np.int32)
        n_patch = int(patch_id.max()) + 1
        if n_patch < 1:
            raise ValueError("the map has no apple patch")
        targets, cents = patch_targets(patch_id)
        texts = ["the target patch, facing its centroid"] * len(_OPTIONS)
        options = option_specs(_OPTIONS, {"apple": target_cap, "patch": n_patch}, texts, wait_steps)
        regions = patch_id[None] == np.arange(n_patch)[:, None, None]
        h, w = patch_id.shape
        cells = np.argwhere(np.ones((h, w), bool)).reshape(h, w, 2)
        face = np.stack([compass_toward(cells, c) for c in cents])
        self._setup(
            env,
            options,
            tuple(o[3] for o in _OPTIONS),
            regions,
            face,
            opt_region=(-1, -1, -1),
            cell_region=patch_id,
            static_targets={GO_TO_PATCH: targets},
        )
        self.game = "harvest"
        self.patch_id = patch_id
        self.num_patches = n_patch
        self.patch_target = targets

    # -- hooks -------------------------------------------------------------------------------------------

    def object_grid(self, state, target_class: str):
        return state.apples

    # -- read set ----------------------------------------------------------------------------------------

    def _patch_of(self, rc):
        """``int32[...]`` patch id of cells ``rc`` (-1 off patches or for -1 targets)."""
        ok = rc[..., 0] >= 0
        return jnp.where(ok, jnp.asarray(self.patch_id).reshape(-1)[self._safe_flat(rc)], -1)

    def _patch_counts(self, state):
        """``int32[P]`` live apples per patch."""
        return jnp.sum(jnp.asarray(self.regions) & state.apples[None], axis=(1, 2), dtype=jnp.int32)

    def features(self, state, aid, inst):
        opt, target = inst.opt, inst.target
        has = target[:, 0] >= 0
        tp = self._patch_of(target)
        mine = self._patch_of(state.pos[aid])
        tgt_apple = jnp.where(has & (opt == EAT_APPLE), jnp.where(self._at(state.apples, target), V_YES, V_NO), V_NA)
        inside = jnp.where((tp >= 0) & (opt != WAIT), jnp.where(tp == mine, V_YES, V_NO), V_NA)
        count = self._patch_counts(state)[jnp.maximum(tp, 0)]
        bucket = sum((count > e).astype(jnp.int32) for e in PATCH_APPLES_EDGES)
        bucket = jnp.where((tp >= 0) & (opt != WAIT), bucket, PA_NA)
        return jnp.stack([tgt_apple, inside, bucket], -1).astype(jnp.int32)

    # -- effect predicates -------------------------------------------------------------------------------

    def snapshot(self, state, aid, target):
        pos = state.pos[aid]
        tp = self._patch_of(target)
        return {
            "ate": state.ate[aid],
            "apples_total": state.apples_total[aid],
            "on_target": jnp.all(pos == target),
            "tgt_apple": self._at(state.apples, target),
            "in_tgt_patch": (tp >= 0) & (self._patch_of(pos) == tp),
        }

    def effect(self, opt, pre, post):
        eat = pre["tgt_apple"] & post["on_target"] & (post["ate"] > 0) & (post["apples_total"] > pre["apples_total"])
        patch = ~pre["in_tgt_patch"] & post["in_tgt_patch"]
        return jnp.stack([eat, patch, jnp.array(True)])[opt]


def make_library(env, **config) -> HarvestOptions:
    """Registry factory (``jaxopt_marl.options.get_library("harvest")``)."""
    return HarvestOptions(env, **config)


__all__ = ["FEATURES", "HarvestOptions", "make_library", "patch_targets"]
