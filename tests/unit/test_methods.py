"""Method names, per-method defaults and validation of the plugin's keys."""

import pytest

from vllm_selfspec import methods
from vllm_selfspec.methods import SelfSpecConfigError, split_config


def test_aliases_and_defaults():
    for name in ("selfspec", "draft_verify", "SelfSpec"):
        m, core, opts = split_config({"method": name})
        assert m.name == "selfspec"
        assert core["num_speculative_tokens"] == methods.SELFSPEC.default_k
        assert core["draft_sample_method"] == "probabilistic"
        assert opts["draft_exit_threshold"] == 0.6 and opts["target_acceptance"] == 0.9
        assert opts["threshold_step"] == 0.01 and opts["beta1"] == 0.5 and opts["beta2"] == 0.9


def test_keys_pass_and_dashes_are_accepted():
    _, core, opts = split_config({"method": "selfspec", "num-speculative-tokens": 6,
                                  "draft_exit_threshold": 0.4, "skip_mask": {"attention": [1]}})
    assert core["num_speculative_tokens"] == 6 and opts["draft_exit_threshold"] == 0.4


def test_unknown_key_names_key_and_valid_choices():
    with pytest.raises(SelfSpecConfigError) as e:
        split_config({"method": "selfspec", "skip_layers": [1]})
    msg = str(e.value)
    assert "unknown key 'skip_layers'" in msg and "skip_mask" in msg and "draft_exit_threshold" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("key,value,frag", [
    ("draft_exit_threshold", 1.5, "in [0.0, 1.0]"),
    ("draft_exit_threshold", "high", "in [0.0, 1.0]"),
    ("beta2", 1.0, "in [0.0, 1.0)"),
    ("adaptive_threshold", "yes", "true or false"),
    ("skip_ratio", -0.1, "in [0.0, 1.0)"),
    ("skip_mask", 3, "file path"),
    ("seed", 1.5, "an integer"),
])
def test_wrong_type_or_range(key, value, frag):
    with pytest.raises(SelfSpecConfigError, match=f"key '{key}'.*must be.*") as e:
        split_config({"method": "selfspec", key: value})
    assert frag in str(e.value)


def test_num_speculative_tokens_and_foreign_keys():
    with pytest.raises(SelfSpecConfigError, match="num_speculative_tokens"):
        split_config({"method": "selfspec", "num_speculative_tokens": 0})
    with pytest.raises(SelfSpecConfigError, match="'model' does not apply"):
        split_config({"method": "selfspec", "model": "some/draft"})
    with pytest.raises(SelfSpecConfigError, match="draft_sample_method"):
        split_config({"method": "selfspec", "draft_sample_method": "nucleus"})


def test_lookup():
    assert methods.lookup("draft_verify") is methods.SELFSPEC
    assert methods.lookup("ngram") is None and methods.lookup(None) is None


def test_bench_groups_keep_a_baseline_in_every_group():
    from vllm_selfspec.offline import bench

    entries = bench.parse_methods("baseline,ngram,a=ngrammys,b=ngrammys,c=chimera", [])
    assert bench.engine_groups(entries, 8) == [entries]
    groups = bench.engine_groups(entries, 3)
    assert [[e.label for e in g] for g in groups] == [["baseline", "ngram", "a"],
                                                      ["baseline", "b", "c"]]
    assert groups[0][0] is entries[0] and groups[1][0] is not entries[0]  # its own engine


def test_bench_rounds_follow_the_batching():
    from vllm_selfspec.offline import bench

    def per_round(*argv: str) -> int:
        return bench.round_prompts(bench.parse_args(list(argv)))

    assert per_round() == 1 and per_round("--batching", "static") == 1
    assert per_round("--concurrency", "4") == 16  # continuous: vLLM refills the 4 slots
    assert per_round("--concurrency", "4", "--batching", "static") == 4
