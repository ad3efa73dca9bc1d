"""The built-in environment: WebShop's text protocol, invalid actions, step limit, concurrency."""

from __future__ import annotations

import threading

import pytest

from trinity_webshop.agents import OracleAgent, RandomAgent, play
from trinity_webshop.env import SEP, WebShopEnv, parse_action


@pytest.fixture(scope="module")
def env():
    return WebShopEnv()


def _goal_with_options(env, count):
    return next(
        i for i in env.catalog.goal_indices("test") if len(env.catalog.goal(i)["goal_options"]) == count
    )


def test_parse_action():
    assert parse_action("search[red shoes]") == ("search", "red shoes")
    assert parse_action(" Click[Buy Now] ") == ("click", "Buy Now")
    assert parse_action("click[< Prev]") == ("click", "< Prev")
    assert parse_action("buy now") == ("buy now", None)
    assert parse_action("[x]") == ("[x]", None)
    assert parse_action("click[x] please") == ("click[x] please", None)


def test_pages_follow_the_text_protocol(env):
    gi = _goal_with_options(env, 2)
    goal = env.catalog.goal(gi)
    s = env.reset(goal_index=gi)
    assert s.observation == SEP.join(["WebShop", "Instruction:", goal["instruction_text"], "Search"])
    assert s.get_available_actions() == {"has_search_bar": True, "clickables": ["search"]}

    obs, reward, done, info = s.step(f"search[{goal['query']}]")
    assert (reward, done, info["invalid"]) == (0.0, False, False)
    parts = obs.split(SEP)
    assert parts[2:6] == [
        "Back to Search",
        f"Page 1 (Total results: {len(s.results)})",
        "Next >",
        s.results[0],
    ]
    first = env.catalog.product(s.results[0])
    assert parts[6:8] == [first["Title"], first["Price"]]
    actions = s.get_available_actions()
    assert actions["has_search_bar"] is False
    assert actions["clickables"][:2] == ["back to search", "next >"]
    assert actions["clickables"][2:] == [a.lower() for a in s.results[:10]]

    s.step("click[Next >]")
    assert "Page 2 (Total results:" in s.observation and "< prev" in s.get_available_actions()["clickables"]
    s.step("click[< Prev]")
    assert s.page == 1

    asin = s.results[0]
    obs, *_ = s.step(f"click[{asin.lower()}]")
    product = env.catalog.product(asin)
    for name, values in product["options"].items():
        assert SEP.join([name, *values]) in obs
    assert obs.endswith(SEP.join(["Description", "Features", "Reviews", "Buy Now"]))
    assert f"Price: {product['Price']}" in obs

    obs, *_ = s.step("click[Features]")
    assert obs.split(SEP)[-len(product["BulletPoints"]) :] == product["BulletPoints"]
    assert s.get_available_actions()["clickables"] == ["back to search", "< prev"]
    s.step("click[< Prev]")
    obs, *_ = s.step("click[Reviews]")
    assert product["Reviews"][0]["body"] in obs
    s.step("click[< Prev]")
    assert s.page_kind == "item"
    s.step("click[Back to Search]")
    assert s.get_available_actions()["has_search_bar"]


def test_invalid_actions_are_reported_and_counted(env):
    s = env.reset(goal_index=3)
    cases = [
        ("click[Buy Now]", "there is no button 'Buy Now' on this page"),
        ("buy the shampoo", "is not an action; reply with search[your query] or click[button text]"),
        ("", "'' is not an action"),
        ("search[]", "the search query is empty"),
        ("click[search]", "to search, write the query inside search[...]"),
    ]
    for number, (action, message) in enumerate(cases, 1):
        obs, reward, done, info = s.step(action)
        assert obs.startswith("Invalid action: ") and message in obs, obs
        assert info["invalid"] and info["error"] in obs
        assert (reward, done, s.invalid_actions, s.env_steps) == (0.0, False, number, number)
    s.step("search[shampoo]")
    obs, *_ = s.step("search[deodorant]")
    assert "there is no search bar on this page; click[Back to Search] first" in obs
    assert s.invalid_actions == 6 and s.page_kind == "results"  # the invalid action changed nothing


def test_unknown_product_id_is_an_invalid_click(env):
    s = env.reset(goal_index=5)
    s.step("search[shampoo]")
    obs, _, done, info = s.step("click[B0NOSUCH00]")
    assert info["invalid"] and not done
    assert "there is no button 'B0NOSUCH00' on this page. Buttons on this page: back to search" in obs
    # a real product that is not on this results page is not clickable either
    elsewhere = next(p["asin"] for p in env.catalog.products if p["asin"] not in s.results[:10])
    assert s.step(f"click[{elsewhere}]")[3]["invalid"]


def test_step_limit_ends_the_episode(env):
    s = env.reset(goal_index=7, max_steps=3)
    results = [s.step("click[nothing]") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    assert results[-1][3]["truncated"] and s.truncated and s.reward == 0.0
    with pytest.raises(RuntimeError, match=r"is over .*after 3 steps"):
        s.step("search[x]")


def test_buying_ends_the_episode_with_the_reward(env):
    gi = _goal_with_options(env, 1)
    goal = env.catalog.goal(gi)
    s = env.reset(goal_index=gi)
    s.step(f"search[{goal['instruction_text']}]")
    s.step(f"click[{goal['asin']}]")
    # buying without the option: attributes + price but not the option
    obs, reward, done, info = s.step("click[Buy Now]")
    n = len(goal["attributes"])
    assert done and not info["truncated"]
    assert reward == pytest.approx((n + 1) / (n + 2))
    assert obs.startswith("Thank you for shopping with us!") and goal["asin"] in obs
    assert s.get_available_actions() == {"has_search_bar": False, "clickables": []}


def test_reset_by_session_id(env):
    assert env.reset(session_id=42).goal_index == 42
    test_env = WebShopEnv(env.catalog, split="test")
    a, b = test_env.reset(session_id="abc"), test_env.reset(session_id="abc")
    assert a.goal_index == b.goal_index and env.catalog.goal(a.goal_index)["split"] == "test"
    assert a is not b and a.session_id == "abc"
    with pytest.raises(IndexError, match="out of range"):
        env.reset(goal_index=10**6)


def test_concurrent_sessions_on_one_env_do_not_interfere(env):
    goals = env.catalog.goal_indices("test")[:24]
    expected = {i: play(env, RandomAgent(seed=i), i).reward for i in goals}
    got: dict[int, float] = {}
    barrier = threading.Barrier(4)

    def worker(chunk):
        barrier.wait()
        for i in chunk:
            got[i] = play(env, RandomAgent(seed=i), i).reward

    threads = [threading.Thread(target=worker, args=(goals[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected
    assert play(env, OracleAgent(), goals[0]).reward == 1.0
