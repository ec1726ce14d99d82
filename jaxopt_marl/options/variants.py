"""Option-library variants (paper §6.1: "each seed also draws one of several option libraries drafted at Stage 1,
so that our results are not contingent on any single hand-polished library").

Pure data (no JAX import: the command line reads the registry before a backend may start). Each game has, besides
its ``canonical`` library, two more drafts of the same Stage-1 schema that differ from it in all three ways the
paper's drafts differ:

- *granularity*: how many instances a capped target class gets (Melting Pot ``target_cap``: the nearest visible
  apples / dirt cells; Overcooked ``counter_cap``: the nearest free / occupied counters) and how long ``wait``
  lasts (``wait_steps``);
- *phrasing*: the menu label of every option (``labels``: option name -> template, ``{x}``/``{y}`` = the target's
  column and row);
- *read sets*: the declared deterministic read set of the options (``read_sets``), hence which guards the
  certificate can adopt (§5.1 Stage 2: only read-set features may appear in a guard).

``compact`` is coarser (fewer instances, a longer wait, terse labels, the smallest read sets that still name the
target's own fact); ``detailed`` is finer (more instances, a one-step wait, descriptive labels, read sets widened
with context features). Executors, termination and the effect predicates (delta form, bound to the acting agent's
private transition: the repaired defects 1-2) are the game's own in every variant; only what a Stage-1 draft
chooses differs. Each entry is the keyword arguments :func:`jaxopt_marl.options.get_library` passes on:
``labels`` and ``read_sets`` are applied by :func:`jaxopt_marl.options.base.apply_variant`, the rest go to the
game's factory.
"""

from __future__ import annotations

COMPACT, DETAILED = "compact", "detailed"

#: prompt family -> variant name -> keyword arguments (see the module docstring).
VARIANTS: dict[str, dict[str, dict]] = {
    "cleanup": {
        COMPACT: dict(
            target_cap=3,
            wait_steps=5,
            labels={
                "eat_apple": "eat @ ({x}, {y})",
                "clean_dirt": "clean @ ({x}, {y})",
                "go_to_river": "river",
                "go_to_orchard": "orchard",
                "wait": "wait 5 steps",
            },
            read_sets={
                "eat_apple": ("tgt_apple",),
                "clean_dirt": ("tgt_dirty", "clean_ready"),
                "go_to_river": ("region",),
                "go_to_orchard": ("region",),
            },
        ),
        DETAILED: dict(
            target_cap=9,
            wait_steps=1,
            labels={
                "eat_apple": "walk onto the apple at ({x}, {y}) and eat it",
                "clean_dirt": "fire the cleaning beam at the dirt at ({x}, {y})",
                "go_to_river": "walk to the river bank and face the river",
                "go_to_orchard": "walk into the orchard and face the apples",
                "wait": "stand still for one step",
            },
            read_sets={
                "eat_apple": ("tgt_apple", "region", "dirt_level"),
                "clean_dirt": ("tgt_dirty", "clean_ready", "region", "dirt_level"),
                "go_to_river": ("region", "dirt_level"),
                "go_to_orchard": ("region", "dirt_level"),
            },
        ),
    },
    "harvest": {
        COMPACT: dict(
            target_cap=3,
            wait_steps=5,
            labels={"eat_apple": "eat @ ({x}, {y})", "go_to_patch": "patch @ ({x}, {y})", "wait": "wait 5 steps"},
            read_sets={"eat_apple": ("tgt_apple",), "go_to_patch": ("in_tgt_patch",)},
        ),
        DETAILED: dict(
            target_cap=9,
            wait_steps=1,
            labels={
                "eat_apple": "walk onto the apple at ({x}, {y}) and eat it",
                "go_to_patch": "walk into the apple patch around ({x}, {y})",
                "wait": "stand still for one step",
            },
            read_sets={
                "eat_apple": ("tgt_apple", "in_tgt_patch", "tgt_patch_apples"),
                "go_to_patch": ("in_tgt_patch", "tgt_patch_apples", "tgt_apple"),
            },
        ),
    },
    "overcooked": {
        COMPACT: dict(
            counter_cap=2,
            wait_steps=3,
            labels={
                "pick_onion": "onion @ ({x}, {y})",
                "pick_dish": "dish @ ({x}, {y})",
                "place_in_pot": "pot @ ({x}, {y}): add",
                "start_cooking": "pot @ ({x}, {y}): cook",
                "plate_soup": "pot @ ({x}, {y}): plate",
                "deliver": "serve @ ({x}, {y})",
                "drop_held": "counter @ ({x}, {y}): put down",
                "pick_from_counter": "counter @ ({x}, {y}): take",
                "wait": "wait 3 steps",
            },
            read_sets={
                "place_in_pot": ("held",),
                "start_cooking": ("tgt_pot_state",),
                "plate_soup": ("held",),
                "drop_held": ("held",),
                "pick_from_counter": ("tgt_item",),
            },
        ),
        DETAILED: dict(
            counter_cap=5,
            wait_steps=1,
            labels={
                "pick_onion": "walk to the onion dispenser at ({x}, {y}) and take an onion",
                "pick_dish": "walk to the dish dispenser at ({x}, {y}) and take a dish",
                "place_in_pot": "put the item you hold into the pot at ({x}, {y})",
                "start_cooking": "switch on the pot at ({x}, {y}) to start cooking",
                "plate_soup": "scoop the soup from the pot at ({x}, {y}) onto your dish",
                "deliver": "hand the soup in at the serving station at ({x}, {y})",
                "drop_held": "put the item you hold down on the counter at ({x}, {y})",
                "pick_from_counter": "pick up the item on the counter at ({x}, {y})",
                "wait": "stand still for one step",
            },
            read_sets={
                "pick_onion": ("held", "tgt_item"),
                "pick_dish": ("held", "tgt_item"),
                "place_in_pot": ("held", "tgt_pot_state", "tgt_item"),
                "plate_soup": ("held", "tgt_pot_state", "tgt_item"),
                "deliver": ("held", "tgt_item"),
            },
        ),
    },
}

#: game -> prompt family of its variants (the two Overcooked layouts share one set).
FAMILY = {"cleanup": "cleanup", "harvest": "harvest", "overcooked_aa": "overcooked", "overcooked_fc": "overcooked"}
#: keyword arguments of a variant applied to the built library rather than passed to its factory.
APPLIED = ("labels", "read_sets")

__all__ = ["APPLIED", "COMPACT", "DETAILED", "FAMILY", "VARIANTS"]
