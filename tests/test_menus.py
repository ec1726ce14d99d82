"""Stage-4 menus: guard mask over the instance table, live NoPath, letter shuffle, menu text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from jaxopt_marl import menus
from jaxopt_marl.guards import Guard, compile_guards
from jaxopt_marl.options import get_library

GUARDS = [
    Guard("start_cooking", "inferred", (("tgt_pot_state", "empty"),), 100),
    Guard("start_cooking", "inferred", (("held", "onion"),), 100),
    Guard("pick_onion", "inferred", (("held", "onion"),), 100),
    Guard("pick_dish", "inferred", (("held", "onion"),), 100),
    Guard("plate_soup", "inferred", (("held", "onion"),), 100),
    Guard("deliver", "inferred", (("held", "onion"),), 100),
    Guard("deliver", "explicit", (("__reason__", "NoPath"),), 100),
    Guard("place_in_pot", "explicit", (("__reason__", "NoPath"),), 100),
    Guard("drop_held", "explicit", (("__reason__", "NoPath"),), 100),
]


@pytest.fixture(scope="module")
def setup():
    env = envs_jax.make("overcooked_aa")
    lib = get_library("overcooked_aa", env)
    return env, lib, compile_guards(GUARDS, lib.vocab)


def example_state(env):
    """The paper's worked example: player at (x, y) = (1, 1), holding an onion, pots empty."""
    _, s = env.reset(jax.random.PRNGKey(0))
    a = s.core.agents
    agents = a.replace(
        pos=a.pos.replace(x=a.pos.x.at[0].set(1), y=a.pos.y.at[0].set(1)),
        dir=a.dir.at[0].set(3),
        inventory=a.inventory.at[0].set(4),
    )
    return s.replace(core=s.core.replace(agents=agents))


def test_menu_matches_worked_example(setup):
    env, lib, guards = setup
    s = example_state(env)
    m = menus.build_menu(lib, guards, s, 0, menus.decision_key(0, 0, 0, 0))
    text = menus.render_menu(lib, m.inst.opt, m.inst.target, m.letters)
    lines = text.split("\n")
    assert lines[0] == "Action menu:"
    assert lines[1].startswith("A) ")
    body = {ln[3:] for ln in lines[1:]}
    for want in (
        "place held item in pot @ (4, 2)",
        "place held item in pot @ (4, 3)",
        "drop held item on counter @ (1, 0)",
        "drop held item on counter @ (2, 1)",
    ):
        assert want in body
    assert not any(ln.startswith(("start cooking", "pick onion", "deliver", "pick up")) for ln in body)
    letters = [ln[0] for ln in lines[1:]]
    assert letters == [menus.LETTERS[i] for i in range(len(letters))]


def test_live_nopath_hides_unreachable_serving_only(setup):
    env, lib, guards = setup
    _, s = env.reset(jax.random.PRNGKey(0))
    inst, feats, live, shown = menus.feasibility(lib, guards, s, 1)
    d = lib.option_id("deliver")
    tg = {
        tuple(t): bool(sh) for t, o, sh in zip(np.asarray(inst.target).tolist(), np.asarray(inst.opt), shown) if o == d
    }
    assert tg == {(1, 3): False, (1, 8): True}
    # start_cooking hidden on the empty pots by the inferred guard
    sc = np.asarray(inst.opt) == lib.option_id("start_cooking")
    assert not np.asarray(shown)[sc].any()


def test_letters_shuffle_per_decision_and_parse(setup):
    env, lib, guards = setup
    s = example_state(env)
    inst, feats, live, shown = menus.feasibility(lib, guards, s, 0)
    n = int(shown.sum())
    orders = set()
    for d in range(12):
        letters = np.asarray(menus.assign_letters(menus.decision_key(7, 3, 0, d), shown))
        assert sorted(letters[letters >= 0].tolist()) == list(range(n))
        assert (letters[~np.asarray(shown)] == -1).all()
        orders.add(tuple(letters.tolist()))
        for i in np.flatnonzero(letters >= 0):
            assert menus.parse_choice(letters, menus.LETTERS[letters[i]]) == i
    assert len(orders) > 1
    same = menus.assign_letters(menus.decision_key(7, 3, 0, 5), shown)
    assert (np.asarray(same) == np.asarray(menus.assign_letters(menus.decision_key(7, 3, 0, 5), shown))).all()
    assert menus.parse_choice(letters, "Z") == -1 and menus.parse_choice(letters, "AB") == -1


def test_batched_menu_fn(setup):
    env, lib, guards = setup
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    states = jax.vmap(lambda k: env.reset(k)[1])(keys)
    fn = menus.make_menu_fn(lib, guards)
    mkeys = jax.vmap(lambda e: jax.vmap(lambda a: menus.decision_key(0, e, a, 0))(jnp.arange(2)))(jnp.arange(3))
    m = fn(states, mkeys)
    assert m.shown.shape == (3, 2, lib.num_instances)
    assert (np.asarray(m.letters).max(-1) + 1 == np.asarray(m.shown).sum(-1)).all()
